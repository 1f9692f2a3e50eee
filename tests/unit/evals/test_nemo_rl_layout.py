"""NeMo-RL's Gym-eval layout: every key is used or refused naming it, and such a config runs end to end."""

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_tau2.config import ConfigError
from nemo_tau2.evals.eval import environment_spec, run_eval, setup_eval
from nemo_tau2.evals.nemo_rl_layout import translate_eval_config
from nemo_tau2.tau2_env import domains
from nemo_tau2.tau2_env.gym_rows import task_row
from nemo_tau2.testing import start_fake_server
from tests.unit.recording_proxy import RecordingProxy

ROOT = Path(__file__).resolve().parents[3]


def upstream_config(data_path: str, save_path: str) -> dict:
    """A config in NeMo-RL's layout, key for key as its nemo_gym_eval.yaml lays it out, on the fake backend."""
    return {
        "eval": {
            "rollout_mode": "nemo_gym",
            "max_rollout_turns": None,
            "metric": "pass@k",
            "num_tests_per_prompt": 1,
            "seed": 42,
            "k_value": 2,
            "save_path": save_path,
            "save_full_gym_result": True,
        },
        "generation": {
            "backend": "fake",
            "max_new_tokens": 1024,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": None,
            "num_prompts_per_step": 8,
            "model_name": None,
            "stop_token_ids": None,
            "stop_strings": None,
            "fake_cfg": {},
            "vllm_cfg": {
                "async_engine": True,
                "expose_http_server": True,
                "precision": "bfloat16",
                "tensor_parallel_size": 1,
                "pipeline_parallel_size": 1,
                "expert_parallel_size": 1,
                "gpu_memory_utilization": 0.9,
                "max_model_len": 8192,
                "enforce_eager": False,
                "kv_cache_dtype": "auto",
                "skip_tokenizer_init": False,
                "tool_parser_plugin": None,
            },
            "colocated": {"enabled": False, "resources": {"gpus_per_node": None, "num_nodes": None}},
        },
        "tokenizer": {"name": "${generation.model_name}", "chat_template": "default", "chat_template_kwargs": None},
        "data": {
            "dataset_name": "NemoGymDataset",
            "data_path": data_path,
            "processor": "nemo_gym_data_processor",
            "env_name": "nemo_gym",
            "repeat": 2,
            "prompt_file": None,
            "system_prompt_file": None,
            "max_input_seq_length": None,
        },
        "env": {
            "should_use_nemo_gym": True,
            "nemo_gym": {
                "config_paths": [
                    "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml",
                    "resources_servers/tau2/configs/tau2.yaml",
                    "responses_api_agents/tau2_agent/configs/user_model.yaml",
                ],
                "rollout_max_attempts_to_avoid_lp_nan": 1,
            },
        },
        "cluster": {"gpus_per_node": 1, "num_nodes": 1},
        "user": {"generation": {"backend": "fake", "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 512}},
    }


def _setup(data: dict):
    return setup_eval(OmegaConf.create(data), config_name="upstream")


def test_every_upstream_key_lands_in_our_schema():
    cfg = _setup(upstream_config("rows.jsonl", "out"))
    assert cfg.policy.generation.backend == "fake" and cfg.eval.k_values == [2] and cfg.eval.metric == "pass@k"
    assert cfg.eval.num_tests_per_prompt == 2  # data.repeat: samples per task
    assert cfg.eval.keep_transcripts and cfg.eval.max_concurrency == 8
    assert cfg.data.data_path == "rows.jsonl" and cfg.gym_env().return_token_ids  # vllm_model_for_training.yaml


def test_save_path_null_goes_to_a_folder_named_after_the_config():
    data = upstream_config("rows.jsonl", "out")
    data["eval"]["save_path"] = None
    assert _setup(data).eval.save_path == "results/upstream"


def test_vllm_keys_we_can_pass_on_reach_vllm_arguments():
    data = upstream_config("rows.jsonl", "out")
    data["generation"] |= {"backend": "vllm", "model_name": "m"}
    data["generation"]["vllm_cfg"] |= {"kv_cache_dtype": "fp8", "tool_parser_plugin": "/p.py"}
    data["tokenizer"] = {"name": "other/tok", "chat_template": "/t.jinja"}
    generation = _setup(data).policy.generation
    assert generation.vllm_cfg.extra_args == [
        "--kv-cache-dtype",
        "fp8",
        "--tool-parser-plugin",
        "/p.py",
        "--tokenizer",
        "other/tok",
    ]
    assert generation.vllm_cfg.http_server_serving_chat_kwargs.chat_template == "/t.jinja"


def _with(path: str, value, data: dict | None = None):
    data = upstream_config("rows.jsonl", "out") if data is None else data
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with("generation.vllm_cfg.pipeline_parallel_size", 2), "generation.vllm_cfg.pipeline_parallel_size: only 1"),
        (_with("generation.vllm_cfg.expert_parallel_size", 4), "generation.vllm_cfg.expert_parallel_size: only 1"),
        (_with("generation.vllm_cfg.skip_tokenizer_init", True), "skip_tokenizer_init: must be false"),
        (_with("generation.colocated.enabled", True), "generation.colocated.enabled: colocation shares"),
        (_with("cluster.num_nodes", 2), "cluster.num_nodes: generation runs on one node"),
        (_with("data.dataset_name", "aime2024"), "data.dataset_name: only NemoGymDataset"),
        (_with("data.processor", "math_data_processor"), "data.processor: must be nemo_gym_data_processor"),
        (_with("data.system_prompt_file", "s.txt"), "data.system_prompt_file: not supported here"),
        (_with("data.max_input_seq_length", 2048), "data.max_input_seq_length: not supported here"),
        (_with("eval.max_rollout_turns", 5), "eval.max_rollout_turns: must be null"),
        (_with("eval.metric", "cons@k"), "eval.metric"),
        (_with("env.nemo_gym.config_paths", ["resources_servers/math/configs/math.yaml"]), "is not a server this"),
        (_with("tokenizer.chat_template_kwargs", "no-thinking"), "tokenizer.chat_template_kwargs: must be a mapping"),
        (
            _with(
                "env.nemo_gym.policy_chat_template_kwargs",
                {"enable_thinking": True},
                _with("tokenizer.chat_template_kwargs", {"enable_thinking": False}),
            ),
            "tokenizer.chat_template_kwargs and env.nemo_gym.policy_chat_template_kwargs: both set",
        ),
        (
            _with(
                "env.nemo_gym.policy_model_server",
                "openai_model",
                _with("tokenizer.chat_template_kwargs", {"enable_thinking": False}),
            ),
            "openai_model sends no chat_template_kwargs",
        ),
        (_with("generation.top_k", -1), "generation.top_k: must be null"),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        _setup(data)


def test_generation_and_policy_generation_together_is_an_error_naming_both():
    data = upstream_config("rows.jsonl", "out")
    data["policy"] = {"generation": copy.deepcopy(data["generation"])}
    with pytest.raises(ConfigError, match="generation and policy.generation: both set"):
        _setup(data)


def test_translation_leaves_our_layout_alone():
    ours = {"eval": {"save_path": "x", "k_values": [1]}, "policy": {"generation": {"backend": "fake"}}, "user": None}
    assert translate_eval_config(ours).config == {k: v for k, v in ours.items() if k != "user"}


def _rows(tmp_path: Path, n: int = 2) -> Path:
    path = tmp_path / "rows.jsonl"
    tasks = domains.get_tasks("airline", "test")[:n]
    path.write_text("".join(json.dumps(task_row("airline", task.id)) + "\n" for task in tasks))
    return path


def test_an_upstream_layout_config_runs_end_to_end_and_scores_one(tmp_path):
    save = tmp_path / "out"
    data = upstream_config(str(_rows(tmp_path)), str(save))
    data["eval"]["bootstrap_samples"] = 0
    data["logger"] = {"tensorboard_enabled": True}
    raw = OmegaConf.create(data)
    summary, table = run_eval(setup_eval(raw), raw)
    assert summary["metrics"]["eval/overall/pass@2"] == 1.0 and summary["metrics"]["eval/overall/num_episodes"] == 4
    assert table.startswith("metric=pass@2 score=1.0000")
    text = (save / "evaluation_data.json").read_text()
    entries = json.loads(text)["evaluation_data"]
    assert [e["sample_index"] for e in entries] == [0, 1, 2, 3] and all(e["reward"] == 1.0 for e in entries)
    # one entry a line: indented, each token id of each prompt was a line (a 97-episode banking eval: 827 MB)
    assert [json.loads(line.rstrip(",")) for line in text.splitlines()[1:-1]] == entries
    assert all(e["agent_ref"] and e["message_log"] and e["extra_env_info"]["domain"] == "airline" for e in entries)
    assert all(e["full_result"]["reward_info"] for e in entries)
    logged = json.loads((save / "logs" / "metrics.jsonl").read_text().splitlines()[-1])
    assert logged["eval/overall/pass@2"] == 1.0
    assert list((save / "logs" / "tensorboard").glob("events.out.tfevents.*"))


def test_prepare_data_rows_and_no_user_block_run_on_the_policy_endpoint(tmp_path, caplog):
    rows = tmp_path / "airline_test.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "examples/prepare_data.py"), "--domains", "airline", "--split", "test"]
        + ["--output", str(rows)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    data = upstream_config(str(rows), str(tmp_path / "out"))
    del data["user"]
    data["env"]["nemo_gym"]["config_paths"] = ["resources_servers/tau2/configs/tau2.yaml"]
    data["data"]["repeat"] = 1
    data["eval"] |= {"k_value": 1, "bootstrap_samples": 0}
    data["generation"]["num_prompts_per_step"] = -1
    raw = OmegaConf.create(data)
    with caplog.at_level(logging.INFO, logger="nemo_tau2.evals"):
        cfg = setup_eval(raw)
    assert cfg.user is None and "user simulator runs on the policy's endpoint" in caplog.text
    assert environment_spec(cfg, [], tmp_path).user_on_policy_endpoint
    summary, _ = run_eval(cfg, raw)
    metrics = summary["metrics"]
    assert metrics["eval/overall/num_episodes"] == 20 and metrics["eval/overall/pass@1"] == 1.0


def test_the_user_model_config_path_without_a_user_block_says_what_to_add():
    data = upstream_config("rows.jsonl", "out")
    del data["user"]
    with pytest.raises(ConfigError, match="user_model.yaml puts the user simulator on its own model: add a user"):
        _setup(data)


def test_tokenizer_chat_template_kwargs_reach_every_policy_request(tmp_path):
    """NeMo-RL's tokenizer.chat_template_kwargs (e.g. Qwen3's enable_thinking) travel to the policy's endpoint in
    every request the Gym model server sends (seen by a proxy in front of the endpoint), and the run still scores."""
    with start_fake_server() as fake:
        proxy = RecordingProxy.start(fake.root_url)
        try:
            data = upstream_config(str(_rows(tmp_path, 1)), str(tmp_path / "out"))
            data["generation"] = {
                "backend": "openai",
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": None,
                "stop_strings": None,
                "openai_cfg": {"base_url": proxy.base_url, "model": "fake-policy"},
            }
            data["tokenizer"] = {
                "name": None,
                "chat_template": "default",
                "chat_template_kwargs": {"enable_thinking": False},
            }
            data["data"]["repeat"] = 1
            data["eval"] |= {"k_value": 1, "bootstrap_samples": 0}
            raw = OmegaConf.create(data)
            cfg = setup_eval(raw)
            assert cfg.gym_env().policy_chat_template_kwargs == {"enable_thinking": False}
            summary, _ = run_eval(cfg, raw)
        finally:
            proxy.stop()
    assert summary["metrics"]["eval/overall/pass@1"] == 1.0
    generations = [body for path, _, body in RecordingProxy.seen if path.endswith("/chat/completions")]
    assert generations and all(body["chat_template_kwargs"] == {"enable_thinking": False} for body in generations)
