"""NeMo-RL's own Gym path against our servers, run inside an environment built as NeMo-RL pins it
(scripts/build_nemo_rl_env.sh): what ``examples/nemo_gym/run_grpo_nemo_gym.py`` and ``grpo_train`` do from the config
file to the training batch, with NeMo-RL's functions, unmodified and in their order.

    python nemo_rl_driver.py --plan PLAN.json --out OUT.json   # PLAN: [{name, config, policy_base_url, overrides}]

It imports NeMo-RL, NeMo-Gym and their dependencies only (never nemo_tau2: it is the client's side). Stood in, and
why (each is off the data path and needs a GPU or a cluster of NeMo-RL's):
- ``policy_generation``: NeMo-RL's ``VllmGeneration`` needs CUDA. ``run_async_nemo_gym_rollout`` reads only its
  ``cfg`` (the context limit); the policy is the endpoint at ``--policy-base-url``, which NeMo-RL would have started
  (its vLLM HTTP server) and whose URL it passes to ``spinup_nemo_gym_actor`` as ``base_urls``.
- Ray: a local Ray of this process's own (``init_ray`` first attaches to any cluster on the machine), and the
  ``NemoGym`` actor's interpreter is this environment's (NeMo-RL's registry maps it to ``uv run --extra nemo_gym``,
  a venv built from NeMo-RL's whole CUDA lock; this environment is that extra's packages at that lock's versions).

The rest is NeMo-RL's: its config loader (``defaults:`` and hydra overrides) and ``MasterConfig``, its tokenizer,
``configure_generation_config`` and ``setup_nemo_gym_config``, its datasets, processor and ``rl_collate_fn``, its
``NemoGym`` actor starting our servers through NeMo-Gym's ``RunHelper``, ``run_nemo_gym_rollout_sync`` with its
conversion and contiguity assert, then GRPO's ``scale_rewards``, ``calculate_baseline_and_std_per_prompt``,
``_apply_mask_sample_filter``, ``add_grpo_token_loss_masks_and_generation_logprobs`` and
``batched_message_log_to_flat_message``. The summary (shapes, masks, rewards, metric names, each episode's numeric
keys) goes to ``--out`` as JSON for the test to check.
"""

import argparse
import json
import os
import sys
import time

import ray
import torch
from omegaconf import OmegaConf


class _GenerationConfigOnly:
    """What ``run_async_nemo_gym_rollout`` reads of NeMo-RL's generation backend: its config."""

    def __init__(self, cfg: dict):
        self.cfg = cfg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plan", required=True, help='JSON: [{"name", "config", "policy_base_url", "overrides"}]')
    parser.add_argument("--out", required=True)
    parser.add_argument("--config-keys", nargs="*", default=[], help="configs to compare with NeMo-RL's own")
    args = parser.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    summaries = {"_missing_keys": {path: _missing_keys(path) for path in args.config_keys}}
    ray.init(address="local", include_dashboard=False, log_to_driver=True)
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES

    ACTOR_ENVIRONMENT_REGISTRY["nemo_rl.environments.nemo_gym.NemoGym"] = PY_EXECUTABLES.SYSTEM
    actors: dict[str, object] = {}  # one NemoGym actor per distinct Gym config and policy URL (as one NeMo-RL run has)
    try:
        for run in plan:
            summaries[run["name"]] = _run(run["config"], run["policy_base_url"], run.get("overrides", []), actors)
            with open(args.out, "w") as f:  # written after each run: a later failure keeps what came before
                json.dump(summaries, f)
    finally:
        for actor in actors.values():
            ray.get(actor.shutdown.remote())
        ray.shutdown()


def _missing_keys(config_path: str) -> list[str]:
    """The keys of NeMo-RL's own examples/configs/grpo_math_1B.yaml that a config lacks (after NeMo-RL's loader and
    its ``MasterConfig`` validation of every section): NeMo-RL reads its config with [] throughout ``setup()``."""
    import nemo_rl
    from nemo_rl.algorithms.grpo import MasterConfig
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers

    def keys(tree: dict, prefix: str = "") -> set[str]:
        found = set()
        for key, value in tree.items():
            found.add(prefix + key)
            if isinstance(value, dict):
                found |= keys(value, prefix + key + ".")
        return found

    register_omegaconf_resolvers()
    reference = os.path.join(os.path.dirname(os.path.dirname(nemo_rl.__file__)), "examples/configs/grpo_math_1B.yaml")
    config = load_config(config_path)
    MasterConfig(**OmegaConf.to_container(config, resolve=True))
    return sorted(keys(OmegaConf.to_container(load_config(reference))) - keys(OmegaConf.to_container(config)))


def _run(config_path: str, policy_base_url: str, overrides: list[str], actors: dict) -> dict:
    """One shipped config, as run_grpo_nemo_gym.py runs it: config to data, the Gym actor, its validation rows."""
    from nemo_rl.algorithms.grpo import MasterConfig
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.data.collate_fn import rl_collate_fn
    from nemo_rl.data.utils import setup_response_data
    from nemo_rl.environments.nemo_gym import setup_nemo_gym_config, should_use_nemo_gym, spinup_nemo_gym_actor
    from nemo_rl.experience.rollouts import run_nemo_gym_rollout_sync
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.utils.config import load_config, parse_hydra_overrides, register_omegaconf_resolvers
    from torchdata.stateful_dataloader import StatefulDataLoader

    register_omegaconf_resolvers()
    config = load_config(config_path)
    if overrides:
        config = parse_hydra_overrides(config, overrides)
    config = MasterConfig(**OmegaConf.to_container(config, resolve=True))
    tokenizer = get_tokenizer(config.policy["tokenizer"])
    config.policy["generation"] = configure_generation_config(config.policy["generation"], tokenizer)
    setup_nemo_gym_config(config, tokenizer)
    assert should_use_nemo_gym(config)
    _, val_dataset = setup_response_data(tokenizer, config.data, env_configs=None)
    is_trajectory_collection = config.env["nemo_gym"].pop("is_trajectory_collection", False) or False

    started = time.monotonic()
    key = json.dumps([config.env["nemo_gym"], policy_base_url, config.policy["model_name"]], sort_keys=True)
    if key not in actors:
        for previous in actors.values():  # one Gym stack at a time: an idle one's servers still took CPU
            ray.get(previous.shutdown.remote())
            ray.kill(previous)
        actors.clear()
        actors[key] = spinup_nemo_gym_actor(
            config.env,
            [policy_base_url],
            config.policy["model_name"],
            tokenizer=tokenizer,
            enable_router_replay=False,
            routed_experts_dtype="int16",
            use_fastokens=False,
        )
    nemo_gym = actors[key]
    summary: dict = {
        "spinup_s": round(time.monotonic() - started, 1),
        "is_trajectory_collection": is_trajectory_collection,
        "validation_rows": len(val_dataset),
        "batches": [],
    }
    # run_grpo_nemo_gym.py: one validation batch of the whole file; collect_trajectories plays it as it is,
    # grpo_train's validation repeats each row val_num_generations_per_prompt times
    loader = StatefulDataLoader(
        val_dataset, batch_size=len(val_dataset), shuffle=False, collate_fn=rl_collate_fn, num_workers=0
    )
    generation_config = {**config.policy["generation"], "stop_token_ids": None, "stop_strings": None}
    for batch in loader:
        if not is_trajectory_collection:
            batch = batch.repeat_interleave(config.grpo.val_num_generations_per_prompt)
        started = time.monotonic()
        result = run_nemo_gym_rollout_sync(
            policy_generation=_GenerationConfigOnly(config.policy["generation"]),
            input_batch=batch,
            tokenizer=tokenizer,
            task_to_env={"nemo_gym": nemo_gym},
            max_seq_len=config.policy["max_total_sequence_length"],
            generation_config=generation_config,
            log_full_result_tables=True,
            max_rollout_turns=None,
            greedy=False,
        )
        summary["batches"].append(_train_step_batch(result, config, tokenizer, time.monotonic() - started))
    return summary


def _train_step_batch(result, config, tokenizer, rollout_s: float) -> dict:
    """grpo_train from the rollout result to the training data, and what the test checks of each step."""
    from nemo_rl.algorithms.grpo import (
        _apply_mask_sample_filter,
        add_grpo_token_loss_masks_and_generation_logprobs,
        extract_initial_prompt_messages,
        scale_rewards,
    )
    from nemo_rl.algorithms.utils import calculate_baseline_and_std_per_prompt
    from nemo_rl.data.llm_message_utils import batched_message_log_to_flat_message

    repeated_batch = scale_rewards(result.final_batch, config.grpo.reward_scaling)
    rewards = repeated_batch["total_reward"]
    baseline, std = calculate_baseline_and_std_per_prompt(
        result.input_ids,
        rewards,
        torch.ones_like(rewards),
        leave_one_out_baseline=config.grpo.use_leave_one_out_baseline,
    )
    prompts = extract_initial_prompt_messages(repeated_batch["message_log"], repeated_batch["length"])
    prompt_flat, _ = batched_message_log_to_flat_message(prompts, pad_value_dict={"token_ids": tokenizer.pad_token_id})
    masked = _apply_mask_sample_filter(repeated_batch)
    add_grpo_token_loss_masks_and_generation_logprobs(repeated_batch["message_log"])
    flat, input_lengths = batched_message_log_to_flat_message(
        repeated_batch["message_log"],
        pad_value_dict={"token_ids": tokenizer.pad_token_id},
        make_sequence_length_divisible_by=config.policy["make_sequence_length_divisible_by"],
    )
    full_results = [
        json.loads(row[0])
        for key, table in result.rollout_metrics.items()
        if key.endswith("/full_result")
        for row in table.data
    ]
    episodes = []
    for log, full in zip(repeated_batch["message_log"], full_results, strict=False):
        generated = sum(len(m["token_ids"]) for m in log if m["role"] == "assistant")
        episodes.append(
            {
                "domain": full.get("domain"),
                "task_id": full.get("task_id"),
                "reward": full.get("reward"),
                "turns": sum(m["role"] == "assistant" for m in log),
                "generated_tokens": generated,
                "numeric_keys": sorted(k for k, v in full.items() if isinstance(v, (bool, int, float))),
                "retrieval_variant": full.get("retrieval_variant"),  # banking_knowledge's (None elsewhere)
                "retrieval_keys": sorted(full.get("retrieval") or {}),  # what its searches and unlocks found
            }
        )
    token_mask = flat["token_loss_mask"]
    return {
        "rollout_s": round(rollout_s, 1),
        "batch_size": len(rewards),
        "rewards": rewards.tolist(),
        "baseline": baseline.tolist(),
        "std": std.tolist(),
        "input_ids_shape": list(flat["token_ids"].shape),
        "first_prompt_shape": list(prompt_flat["token_ids"].shape),
        "input_lengths": input_lengths.tolist(),
        "loss_mask_tokens": token_mask.sum(dim=1).tolist(),
        "generated_tokens": [e["generated_tokens"] for e in episodes],
        "generation_logprobs_shape": list(flat["generation_logprobs"].shape),
        "logprobs_outside_mask": float((flat["generation_logprobs"] * (1 - token_mask)).abs().sum()),
        "sample_mask": repeated_batch["loss_multiplier"].tolist(),
        "num_mask_sample_filtered": masked,
        "truncated": repeated_batch["truncated"].tolist(),
        "reward_columns": sorted(k for k in repeated_batch if k.startswith("reward/")),
        "rollout_metric_names": sorted(k for k in result.rollout_metrics if not k.endswith("/full_result")),
        "episodes": episodes,
    }


if __name__ == "__main__":
    sys.exit(main())
