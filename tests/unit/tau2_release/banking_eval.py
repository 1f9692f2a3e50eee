"""An eval of tau2 v1.0.1's banking_knowledge on the fake servers: the scripted policy plays each task's gold
actions, the scripted user its scenario (both from the release's own tasks), the scripted judge grades."""

from pathlib import Path

from omegaconf import OmegaConf

from nemo_tau2.config import apply_overrides, load_config
from tests.tau2_v1_env import tau2_v1_python

FAKE = "examples/configs/evals/tau2_fake.yaml"
DOMAIN = "banking_knowledge"


def banking_eval_config(save: Path, judge, release_tasks: Path, *overrides: str):
    raw = apply_overrides(
        load_config(FAKE),
        [
            f"eval.save_path={save}",
            "eval.num_tests_per_prompt=1",
            "eval.k_values=[1]",
            "eval.bootstrap_samples=0",
            "eval.max_concurrency=16",
            "data.split=base",
            "++tau2.version=v1.0.1",
            f"++tau2.python={tau2_v1_python()}",
            "++tau2.judge.model=scripted-judge",
            f"++tau2.judge.base_url={judge.base_url}",
            f"++policy.generation.fake_cfg.tau2.release_tasks={release_tasks}",
            f"++user.generation.fake_cfg.tau2.release_tasks={release_tasks}",
            *overrides,
        ],
    )
    raw.data.domains = OmegaConf.create([DOMAIN])
    return raw
