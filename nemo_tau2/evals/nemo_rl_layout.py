"""NeMo-RL's Gym-eval config layout, translated once into ours.

NeMo-RL's Gym evaluation (``examples/configs/evals/nemo_gym_eval.yaml``, PR #2453) lays a config out as top-level
``eval``, ``generation``, ``tokenizer``, ``data``, ``env``, ``cluster``. :func:`translate_eval_config` rewrites such a
config into our layout (``policy.generation``, ``eval.k_values``, ``data.data_path``, ``env.nemo_gym``, ...) so that
:class:`~nemo_tau2.evals.config.EvalMasterConfig` stays the one schema of every setting. It runs on every eval config;
a config already in our layout passes through unchanged; aliases (``eval.k_value``, ``generation``...) work in either.

Every upstream key is used, or accepted with the reason in :data:`ACCEPTED`; a value we cannot honour (pipeline
parallelism, colocation on a backend that is not vLLM, a dataset that is not Gym rows, a Gym server config that is not
ours) is refused naming the key and what to set instead, never silently ignored.
"""

import copy
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.config import ConfigError

# Accepted keys whose value changes nothing here, and why (docs/eval.md, "Coming from NeMo-RL", lists them too).
ACCEPTED = {
    "data.processor": "nemo_gym_data_processor is how Gym rows are read; rows are read as Gym rows here",
    "data.env_name": "nemo_gym is the only environment here",
    "env.should_use_nemo_gym": "eval.rollout_mode=nemo_gym selects Gym rollouts",
    "env.nemo_gym.rollout_max_attempts_to_avoid_lp_nan": "NaN logprobs are an infrastructure error here, retried "
    "by the agent's policy_retry",
    "env.nemo_gym.port_range_low": "Gym servers bind free ports on 127.0.0.1",
    "env.nemo_gym.port_range_high": "Gym servers bind free ports on 127.0.0.1",
    "env.nemo_gym.num_gpu_nodes": "the Gym servers take no GPU",
    "env.nemo_gym.is_trajectory_collection": "every episode is written to rollouts.jsonl",
    "env.nemo_gym.invalid_tool_call_patterns": "malformed tool calls are tool errors the agent counts (tau2's rule)",
    "env.nemo_gym.thinking_tags": "thinking is kept in the transcript as the model wrote it",
    "env.nemo_gym.use_fastokens": "the endpoint returns token ids; no driver-side tokenizer runs",
    "generation.num_prompts_per_step (-1 or null)": "all episodes are queued; eval.max_concurrency bounds those in "
    "flight (a positive value sets it)",
    "generation.vllm_cfg.kv_cache_dtype (auto)": "vLLM's default; another value is passed as --kv-cache-dtype",
    "generation.vllm_cfg.tool_parser_plugin": "passed to vLLM as --tool-parser-plugin",
    "tokenizer.name (the model's own)": "the endpoint tokenizes; another name is passed to vLLM as --tokenizer",
    "tokenizer.chat_template (default or null)": "the endpoint renders with the model's template; a file path is "
    "set as the backend's chat_template",
    "cluster.gpus_per_node": "checked to hold vLLM's tensor_parallel_size x data_parallel_size GPUs",
    "cluster.num_nodes (1)": "generation runs on this node",
}

# Gym server configs (as NeMo-RL lists them in env.nemo_gym.config_paths) that name servers this project runs.
TAU2_SERVERS = "resources_servers/tau2/configs/tau2.yaml"
USER_MODEL = "responses_api_agents/tau2_agent/configs/user_model.yaml"
POLICY_MODEL_FOR_TRAINING = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
POLICY_MODEL = "responses_api_models/vllm_model/configs/vllm_model.yaml"
KNOWN_SERVER_CONFIGS = (TAU2_SERVERS, USER_MODEL, POLICY_MODEL_FOR_TRAINING, POLICY_MODEL)

_PASS_THROUGH_GYM_KEYS = {key.removeprefix("env.nemo_gym.") for key in ACCEPTED if key.startswith("env.nemo_gym.")}
_COLOCATED_KEYS = {"enabled", "resources"}
_TOKENIZER_KEYS = {"name", "chat_template", "chat_template_kwargs"}
_CLUSTER_KEYS = {"gpus_per_node", "num_nodes"}
_CHAT_TEMPLATE_FIELD = {
    "vllm": ("vllm_cfg", "http_server_serving_chat_kwargs"),
    "hf": ("hf_cfg",),
    "llamacpp": ("llamacpp_cfg",),
}


@dataclass
class Translation:
    """The config in our layout, and lines to tell the user at the start (what was filled in, and from where)."""

    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    generation_key: str = "policy.generation"
    """Where the user wrote the policy's generation block (``generation`` in NeMo-RL's layout), for messages."""


class _Problems(list):
    def unknown(self, block: dict, allowed: set[str], key: str, owner: str = "NeMo-RL's {key} block has") -> None:
        for name in sorted(set(block) - allowed):
            self.append(f"{key}.{name}: unknown key ({owner.format(key=key)}: {', '.join(sorted(allowed))})")


def _mapping(value: Any, key: str, problems: _Problems) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{key}: must be a mapping, got {value!r}")
        return {}
    return value


def translate_eval_config(data: dict[str, Any], *, config_name: str = "eval") -> Translation:
    """Rewrite a resolved eval config (NeMo-RL's layout, ours, or a mix) into our layout.

    Args:
        data: The config as plain data, interpolations resolved (``${generation.model_name}`` read before it moves).
        config_name: Names the default results folder (``results/<config_name>``) when ``eval.save_path`` is null.

    Raises:
        ConfigError: Every key set to what cannot be honoured, one per line, each naming the key and the fix.
    """
    data = copy.deepcopy(data)
    problems = _Problems()
    notes: list[str] = []
    eval_block = data.get("eval")
    if eval_block is None:
        eval_block = data["eval"] = {}
    if not isinstance(eval_block, dict):
        raise ConfigError(f"eval: must be a mapping, got {eval_block!r}")
    mode = eval_block.get("rollout_mode", "nemo_gym")

    generation_key = _move_generation(data, problems)
    cluster = _mapping(data.get("cluster"), "cluster", problems)  # kept: NeMo-RL's keys and ours (where Ray runs)
    problems.unknown(cluster, set(ClusterConfig.model_fields), "cluster", "the cluster block takes")
    if (cluster.get("num_nodes") or 1) > 1:
        problems.append(f"cluster.num_nodes: generation runs on one node here, got {cluster['num_nodes']}; set 1")
    policy_generation = (data.get("policy") or {}).get("generation")
    if isinstance(policy_generation, dict):
        concurrency = _translate_generation(policy_generation, generation_key, problems, cluster)
        if concurrency is not None and "max_concurrency" not in eval_block:
            eval_block["max_concurrency"] = concurrency
        template_kwargs = _translate_tokenizer(
            data.pop("tokenizer", None), policy_generation, generation_key, problems
        )
    else:
        template_kwargs = None
        data.pop("tokenizer", None)
    user_generation = (data.get("user") or {}).get("generation")
    if isinstance(user_generation, dict):
        _translate_generation(user_generation, "user.generation", problems, {})

    repeat = _translate_data(data, problems)
    _translate_eval(eval_block, mode, repeat, config_name, problems)
    _translate_env(data, mode, problems)
    if template_kwargs:
        _carry_template_kwargs(data, template_kwargs, mode, problems)
    if mode == "nemo_gym" and data.get("user") is None:
        data.pop("user", None)
        notes.append(
            "user: no user block, so the user simulator runs on the policy's endpoint (as NeMo-Gym's tau2 agent "
            "does); add a user block (user.generation) to give it its own model"
        )
    if problems:
        raise ConfigError("\n".join(problems), problems=problems)
    return Translation(data, notes, generation_key)


def _move_generation(data: dict, problems: _Problems) -> str:
    """Top-level ``generation`` becomes ``policy.generation``; both at once is an error naming both."""
    if "generation" not in data:
        return "policy.generation"
    generation = data.pop("generation")
    policy = data.get("policy")
    if isinstance(policy, dict) and policy.get("generation") is not None:
        problems.append(
            "generation and policy.generation: both set the policy's generation block; keep one (generation is "
            "NeMo-RL's eval layout, policy.generation ours)"
        )
        return "policy.generation"
    data["policy"] = {**(policy if isinstance(policy, dict) else {}), "generation": generation}
    return "generation"


def _translate_generation(block: dict, key: str, problems: _Problems, cluster: dict) -> int | None:
    """NeMo-RL's generation keys we have no field for: used, or refused naming the key. Returns the concurrency
    ``num_prompts_per_step`` asks for, if any."""
    backend = block.get("backend")
    colocated = _mapping(block.pop("colocated", None), f"{key}.colocated", problems)
    problems.unknown(colocated, _COLOCATED_KEYS, f"{key}.colocated")
    resources = _mapping(colocated.get("resources"), f"{key}.colocated.resources", problems)
    problems.unknown(resources, _CLUSTER_KEYS, f"{key}.colocated.resources")
    if colocated.get("enabled") and backend != "vllm":
        problems.append(
            f"{key}.colocated.enabled: colocation shares the cluster's GPUs with vLLM, and backend {backend!r} runs "
            f"its own server; set {key}.colocated.enabled=false"
        )
    if (resources.get("num_nodes") or 1) > 1:
        problems.append(f"{key}.colocated.resources.num_nodes: generation runs on one node here; set 1 or null")
    concurrency = None
    per_step = block.pop("num_prompts_per_step", None)
    if per_step is not None and per_step != -1:
        if not isinstance(per_step, int) or per_step < 1:
            problems.append(f"{key}.num_prompts_per_step: must be -1 (all) or a positive number, got {per_step!r}")
        else:
            concurrency = per_step
    vllm_cfg = block.get("vllm_cfg")
    if isinstance(vllm_cfg, dict):
        _translate_vllm_cfg(vllm_cfg, f"{key}.vllm_cfg", problems)
        gpus = (resources if colocated.get("enabled") is False else cluster).get("gpus_per_node")
        needed = vllm_cfg.get("tensor_parallel_size", 1) * vllm_cfg.get("data_parallel_size", 1)
        if backend == "vllm" and vllm_cfg.get("device", "cuda") == "cuda" and gpus is not None and gpus < needed:
            where = f"{key}.colocated.resources" if colocated.get("enabled") is False else "cluster"
            problems.append(
                f"{where}.gpus_per_node: {gpus} GPU(s) cannot hold vLLM's tensor_parallel_size x data_parallel_size "
                f"= {needed}; raise it or lower {key}.vllm_cfg.data_parallel_size"
            )
    return concurrency


def _translate_vllm_cfg(vllm_cfg: dict, key: str, problems: _Problems) -> None:
    extra = list(vllm_cfg.get("extra_args") or [])
    for name in ("pipeline_parallel_size", "expert_parallel_size"):
        value = vllm_cfg.pop(name, None)
        if value not in (None, 1):
            problems.append(
                f"{key}.{name}: only 1 is supported here (vLLM runs tensor_parallel_size x data_parallel_size GPUs "
                f"per node), got {value!r}; set {key}.{name}=1 and use tensor_parallel_size"
            )
    if vllm_cfg.pop("skip_tokenizer_init", None):
        problems.append(
            f"{key}.skip_tokenizer_init: must be false: the HTTP server Gym rollouts talk to needs the tokenizer "
            f"(NeMo-RL forces it false too); set {key}.skip_tokenizer_init=false"
        )
    kv_cache_dtype = vllm_cfg.pop("kv_cache_dtype", None)
    if kv_cache_dtype not in (None, "auto"):
        extra += ["--kv-cache-dtype", str(kv_cache_dtype)]
    plugin = vllm_cfg.pop("tool_parser_plugin", None)
    if plugin:
        extra += ["--tool-parser-plugin", str(plugin)]
    if extra:
        vllm_cfg["extra_args"] = extra


def _translate_tokenizer(tokenizer: Any, generation: dict, key: str, problems: _Problems) -> Any:
    tokenizer = _mapping(tokenizer, "tokenizer", problems)
    problems.unknown(tokenizer, _TOKENIZER_KEYS, "tokenizer")
    backend = generation.get("backend")
    name = tokenizer.get("name")
    if name not in (None, generation.get("model_name")):
        if backend == "vllm":
            generation.setdefault("vllm_cfg", {})
            generation["vllm_cfg"] = {
                **(generation["vllm_cfg"] or {}),
                "extra_args": [*((generation["vllm_cfg"] or {}).get("extra_args") or []), "--tokenizer", str(name)],
            }
        else:
            problems.append(
                f"tokenizer.name: backend {backend!r} tokenizes with its model's own tokenizer, got {name!r}; set "
                f"tokenizer.name=null (or {key}.model_name)"
            )
    template = tokenizer.get("chat_template")
    if template not in (None, "default"):
        path = _CHAT_TEMPLATE_FIELD.get(backend)
        if path is None:
            problems.append(
                f"tokenizer.chat_template: backend {backend!r} renders prompts with its own template; set "
                "tokenizer.chat_template=default"
            )
        else:
            block = generation
            for part in path:
                block[part] = dict(block.get(part) or {})
                block = block[part]
            if block.get("chat_template") not in (None, template):
                problems.append(
                    f"tokenizer.chat_template and {key}.{'.'.join(path)}.chat_template: both set, differently; "
                    "keep one"
                )
            block["chat_template"] = template
    return tokenizer.get("chat_template_kwargs")


def _translate_data(data: dict, problems: _Problems) -> int:
    """NeMo-RL's data keys. Returns ``data.repeat`` (samples per task multiply by it)."""
    block = data.get("data")
    if not isinstance(block, dict):
        return 1
    dataset = block.pop("dataset_name", None)
    if dataset is not None and dataset != "NemoGymDataset":
        problems.append(
            f"data.dataset_name: only NemoGymDataset (Gym JSONL rows) is evaluated here, got {dataset!r}; write "
            "rows with examples/prepare_data.py and set data.dataset_name=NemoGymDataset data.data_path=<rows>"
        )
    if dataset == "NemoGymDataset" and not block.get("data_path"):
        problems.append("data.data_path: NemoGymDataset needs the rows file (examples/prepare_data.py writes one)")
    for name, allowed in (("processor", "nemo_gym_data_processor"), ("env_name", "nemo_gym")):
        value = block.pop(name, None)
        if value not in (None, allowed):
            problems.append(f"data.{name}: must be {allowed} (Gym rows), got {value!r}; set data.{name}={allowed}")
    for name, why in (
        ("prompt_file", "the simulated user writes the user's turns"),
        ("system_prompt_file", "Gym rows carry tau2's system prompt with the domain policy, part of the benchmark"),
        (
            "max_input_seq_length",
            "rows are not tokenized by the driver; each prompt is bounded by the endpoint's "
            "max_model_len, and an overflow is reported per episode",
        ),
    ):
        value = block.pop(name, None)
        if value is not None:
            problems.append(f"data.{name}: not supported here ({why}), got {value!r}; set data.{name}=null")
    repeat = block.pop("repeat", None)
    if repeat is None:
        return 1
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        problems.append(f"data.repeat: must be a positive number of samples per task, got {repeat!r}")
        return 1
    return repeat


def _translate_eval(block: dict, mode: str, repeat: int, config_name: str, problems: _Problems) -> None:
    if "k_value" in block:
        k_value = block.pop("k_value")
        if "k_values" in block and block["k_values"] != [k_value]:
            problems.append(
                f"eval.k_value and eval.k_values: both set, differently ({k_value!r} vs {block['k_values']!r}); "
                "keep one (k_value is NeMo-RL's single k)"
            )
        else:
            block["k_values"] = [k_value]
    if "save_full_gym_result" in block:
        full = block.pop("save_full_gym_result")
        if "keep_transcripts" in block and block["keep_transcripts"] != full:
            problems.append("eval.save_full_gym_result and eval.keep_transcripts: both set, differently; keep one")
        else:
            block["keep_transcripts"] = full
    turns = block.pop("max_rollout_turns", None)
    if turns is not None and (mode == "nemo_gym" or turns != 1):
        problems.append(
            f"eval.max_rollout_turns: must be null (the Gym agent owns turn limits: env.nemo_gym.max_turns and "
            f"max_steps), got {turns!r}; set eval.max_rollout_turns=null"
        )
    if repeat > 1:
        block["num_tests_per_prompt"] = block.get("num_tests_per_prompt", 1) * repeat
    if block.get("save_path") is None:
        block["save_path"] = f"results/{config_name}"  # the entry point prints where results go


def _carry_template_kwargs(data: dict, kwargs: Any, mode: str, problems: _Problems) -> None:
    """``tokenizer.chat_template_kwargs`` -> ``env.nemo_gym.policy_chat_template_kwargs``: the policy's Gym model
    server adds them to every request, as NeMo-Gym's vllm_model does with its ``chat_template_kwargs``."""
    if not isinstance(kwargs, dict):
        problems.append(f"tokenizer.chat_template_kwargs: must be a mapping, got {kwargs!r}")
        return
    if mode != "nemo_gym":
        problems.append(
            "tokenizer.chat_template_kwargs: the Gym model server carries them, so only with "
            "eval.rollout_mode=nemo_gym; set tokenizer.chat_template_kwargs=null"
        )
        return
    env = data.get("env")
    if env is None:
        env = data["env"] = {}
    if not isinstance(env, dict):
        return
    if env.get("nemo_gym") is None:
        env["nemo_gym"] = {}
    gym = env["nemo_gym"]
    if not isinstance(gym, dict):
        return
    if gym.get("policy_chat_template_kwargs") not in (None, kwargs):
        problems.append(
            "tokenizer.chat_template_kwargs and env.nemo_gym.policy_chat_template_kwargs: both set, differently; "
            "keep one"
        )
        return
    gym["policy_chat_template_kwargs"] = kwargs


def _translate_env(data: dict, mode: str, problems: _Problems) -> None:
    env = data.get("env")
    if not isinstance(env, dict):
        return
    if env.pop("should_use_nemo_gym", None) is False and mode == "nemo_gym":
        problems.append("env.should_use_nemo_gym: false contradicts eval.rollout_mode=nemo_gym; set one of them")
    gym = env.get("nemo_gym")
    if not isinstance(gym, dict):
        return
    for name in _PASS_THROUGH_GYM_KEYS:
        gym.pop(name, None)
    paths = gym.pop("config_paths", None)
    if paths is None:
        return
    recognised = set()
    for path in paths if isinstance(paths, list) else [paths]:
        known = _known_server_config(str(path))
        if known is None:
            problems.append(
                f"env.nemo_gym.config_paths: {path!r} is not a server this project runs; it runs tau2's servers "
                f"({', '.join(KNOWN_SERVER_CONFIGS)})"
            )
        recognised.add(known)
    if TAU2_SERVERS not in recognised:
        problems.append(f"env.nemo_gym.config_paths: must include {TAU2_SERVERS} (tau2's resources server and agent)")
    if USER_MODEL in recognised and data.get("user") is None:
        problems.append(
            f"env.nemo_gym.config_paths: {USER_MODEL} puts the user simulator on its own model: add a user block "
            "(user.generation) naming it, or drop the path to share the policy's endpoint"
        )
    if POLICY_MODEL_FOR_TRAINING in recognised:
        gym.setdefault("return_token_ids", True)


def _known_server_config(path: str) -> str | None:
    """Which of our server configs ``path`` names (NeMo-RL writes them relative to Gym's checkout)."""
    parts = PurePosixPath(path.replace("\\", "/")).parts
    for known in KNOWN_SERVER_CONFIGS:
        tail = PurePosixPath(known).parts
        if parts[-len(tail) :] == tail:
            return known
    return None
