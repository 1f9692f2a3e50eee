"""The evaluation config (``examples/configs/evals/*.yaml``), mirroring NeMo-RL's eval ``MasterConfig``.

Two rollout modes share one file layout: ``nemo_gym`` plays whole tau2 episodes with a simulated user through the
Gym servers (needs ``user`` and ``env.nemo_gym``); ``single_turn`` generates once per prompt of a plain
prompt/answer JSONL and scores it with a single-step verifier (needs ``eval.verifier`` and ``data.data_path``).
A setting that only applies to the other mode is an error, not silently ignored.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.generation.validation import GREEDY_NOT_ALLOWED, GymGenerationConfig
from nemo_tau2.gym.episode_config import CLUSTER_FOR_REPLICAS, NemoGymEnvConfig, UserSimulatorConfig
from nemo_tau2.tau2_env import ALL_DOMAINS, domain_problem
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig
from nemo_tau2.utils.metrics_logger import LoggerConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EvalSettings(_Strict):
    rollout_mode: Literal["nemo_gym", "single_turn"] = "nemo_gym"
    num_tests_per_prompt: int = Field(default=1, ge=1, description="Samples per task (n); any n >= 1.")
    k_values: list[int] = Field(default=[1], description="k of pass@k and pass^k; each must be <= n.")
    metric: Literal["pass@k", "mean_reward"] = Field(
        default="pass@k", description="NeMo-RL's headline metric: which one the table leads with (all are reported)."
    )
    seed: int = 42
    save_path: str = Field(
        description="Directory for config.json, rollouts.jsonl (resumable), summary.json and evaluation_data.json; "
        "null: results/<config name>."
    )
    max_concurrency: int = Field(default=64, ge=1, description="Episodes in flight at once.")
    bootstrap_samples: int = Field(default=1000, ge=0, description="Resamples for 95% intervals (0: none).")
    keep_transcripts: bool = Field(default=True, description="Write each episode's transcript into rollouts.jsonl.")
    greedy: bool = Field(default=False, description="NeMo-RL's flag; not allowed with nemo_gym rollouts.")
    verifier: Literal["exact_match", "contains"] | None = Field(
        default=None, description="single_turn only: how a generation is scored against the row's answer."
    )
    request_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        allow_inf_nan=False,
        description="single_turn only: the wait for one completion from the policy's endpoint, connect to last "
        "byte (a long generation on a loaded server takes minutes).",
    )

    @model_validator(mode="after")
    def _k_within_n(self) -> "EvalSettings":
        n, problems = self.num_tests_per_prompt, []
        if self.greedy and self.rollout_mode == "nemo_gym":
            problems.append(f"greedy: {GREEDY_NOT_ALLOWED}")
        too_big = [k for k in self.k_values if k > n]
        if not self.k_values:
            problems.append("k_values is empty; set eval.k_values=[1] (or any k from 1 to num_tests_per_prompt)")
        elif any(k < 1 for k in self.k_values):
            problems.append(f"k_values {self.k_values}: every k must be >= 1; set eval.k_values=[1]")
        elif too_big:
            fitting = [k for k in self.k_values if k <= n] or [1]
            problems.append(
                f"k_values {self.k_values}: k={', '.join(map(str, too_big))} exceed num_tests_per_prompt ({n}), "
                "perhaps left over from a parent config; add the override "
                f"eval.k_values=[{','.join(map(str, fitting))}] (or eval.num_tests_per_prompt={max(too_big)})"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class EvalData(_Strict):
    domains: list[str] | None = Field(default=None, description="nemo_gym: tau2 domains to evaluate.")
    split: str | None = Field(
        default="test", description="nemo_gym: tau2 split (train, test, base; telecom also full)."
    )
    num_tasks: int | None = Field(default=None, ge=1, description="nemo_gym: the first N tasks of each domain.")
    task_ids: list[str] | None = Field(default=None, description="nemo_gym: only these task ids.")
    data_path: str | None = Field(
        default=None, description="nemo_gym: Gym JSONL rows instead of a split; single_turn: prompt/answer JSONL."
    )
    prompt_key: str = Field(default="prompt", description="single_turn: field with the prompt (string or messages).")
    answer_key: str = Field(default="answer", description="single_turn: field with the expected answer.")

    @model_validator(mode="after")
    def _known_domains(self) -> "EvalData":
        unknown = [domain for domain in self.domains or [] if domain not in ALL_DOMAINS]
        if unknown:
            raise ValueError(f"data.domains: unknown domain(s) {unknown}; tau2 domains are: {', '.join(ALL_DOMAINS)}")
        return self


class PolicyConfig(_Strict):
    generation: GymGenerationConfig


class EvalEnvConfig(_Strict):
    nemo_gym: NemoGymEnvConfig | None = None


class EvalLoggerConfig(LoggerConfig):
    """``logger``: where evaluation metrics go besides ``summary.json`` (GRPO's sinks, one step per run)."""

    log_dir: str | None = Field(default=None, description="null: <eval.save_path>/logs.")


class EvalMasterConfig(_Strict):
    eval: EvalSettings
    policy: PolicyConfig
    data: EvalData = EvalData()
    user: UserSimulatorConfig | None = None
    env: EvalEnvConfig = EvalEnvConfig()
    logger: EvalLoggerConfig = EvalLoggerConfig()
    tau2: Tau2ReleaseConfig = Field(default_factory=Tau2ReleaseConfig, description="Which tau2 release scores.")
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _mode_settings(self) -> "EvalMasterConfig":
        problems = []
        if self.eval.rollout_mode == "nemo_gym":
            if self.eval.verifier is not None:
                problems.append("eval.verifier applies only to rollout_mode=single_turn")
            if not self.data.domains and not self.data.data_path:
                problems.append("data.domains (or data.data_path with Gym rows) is required for nemo_gym rollouts")
            if self.data.domains and not self.data.data_path and self.data.split is None:
                problems.append("data.split is required with data.domains; set data.split=test (or train, base)")
            release = [domain_problem(domain, self.tau2.version) for domain in self.data.domains or []]
            problems += [f"data.domains: {problem}" for problem in release if problem]
            gym = self.gym_env()
            if gym.agent_replicas * gym.resources_replicas > 1 and self.cluster.gym_placement != "ray":
                problems.append(CLUSTER_FOR_REPLICAS)
            problems += self.policy.generation.ray_placement_problems(self.cluster)
            for key in ("prompt_key", "answer_key"):
                if key in self.data.model_fields_set:
                    problems.append(f"data.{key} applies only to rollout_mode=single_turn; remove it")
        else:
            if self.eval.verifier is None:
                problems.append(
                    "eval.verifier is required for rollout_mode=single_turn; add the override "
                    "+eval.verifier=exact_match (or contains)"
                )
            if self.user is not None:
                problems.append(
                    "user applies only to rollout_mode=nemo_gym (single_turn has no simulated user); add the override "
                    "user=null"
                )
            if self.env.nemo_gym is not None:
                problems.append(
                    "env.nemo_gym applies only to rollout_mode=nemo_gym; add the override env.nemo_gym=null"
                )
            if not self.data.data_path:
                problems.append("data.data_path (a prompt/answer JSONL) is required for rollout_mode=single_turn")
            for key in ("domains", "num_tasks", "task_ids"):
                if getattr(self.data, key) is not None:
                    problems.append(
                        f"data.{key} applies only to rollout_mode=nemo_gym; add the override data.{key}=null"
                    )
            if "split" in self.data.model_fields_set and self.data.split is not None:
                problems.append("data.split applies only to rollout_mode=nemo_gym; add the override data.split=null")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def gym_env(self) -> NemoGymEnvConfig:
        return self.env.nemo_gym or NemoGymEnvConfig()

    def user_simulator(self) -> UserSimulatorConfig:
        """The ``user`` block, or (none given) a user simulator on the policy's endpoint with its sampling."""
        return self.user or UserSimulatorConfig(generation=self.policy.generation)


def as_plain(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")
