"""The memory plan: sizes from config.json only, `run_grpo.py --plan` on the shipped recipes, and the start-up
refusal of a config that cannot fit (exit 2 naming what to change, before anything starts)."""

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_tau2.gym.capacity import CPU_S_PER_POLICY_TURN, plan_gym_capacity
from nemo_tau2.models.memory_plan import GB, ClusterConfig, make_plan
from nemo_tau2.models.model_shape import find_model_config, model_shape
from nemo_tau2.models.policy import PolicyConfig

ROOT = Path(__file__).parents[3]
RUN_GRPO = ROOT / "examples" / "run_grpo.py"
QWEN3_4B = "Qwen/Qwen3-4B-Instruct-2507"


@pytest.fixture(scope="module")
def qwen3_4b():
    config, source = find_model_config(QWEN3_4B)
    assert source.startswith("nemo_tau2/models/hf_configs/") or "cache" in source
    return model_shape(config, QWEN3_4B, source)


def _policy(**overrides) -> PolicyConfig:
    fields = {
        "model_name": QWEN3_4B,
        "train_global_batch_size": 64,
        "train_micro_batch_size": 1,
        "max_total_sequence_length": 32768,
        "precision": "bfloat16",
        "device": "cuda",
        "num_workers": 1,
    }
    return PolicyConfig.model_validate(fields | overrides)


def test_the_model_is_sized_from_its_config_json_alone(qwen3_4b):
    assert qwen3_4b.parameters == 4_022_468_096  # Qwen3-4B: tied embeddings counted once
    assert qwen3_4b.num_blocks == 36 and qwen3_4b.vocab_size == 151936
    assert qwen3_4b.block_parameters * 36 + qwen3_4b.root_parameters == qwen3_4b.parameters


def test_sharding_divides_the_states_by_the_ranks_and_cpu_offload_moves_them_to_the_host(qwen3_4b):
    cluster = ClusterConfig()
    replica = make_plan(_policy(), cluster, reference=True, shape=qwen3_4b).devices[0]
    assert replica.items["parameters (fp32)"] == 4 * qwen3_4b.parameters
    assert replica.items["optimizer state (8 B/param)"] == 8 * qwen3_4b.parameters
    assert replica.items["reference model (fp32)"] == 4 * qwen3_4b.parameters
    sharded_cfg = _policy(num_workers=8, dtensor_cfg={"enabled": True})
    sharded = make_plan(sharded_cfg, cluster, reference=True, shape=qwen3_4b).devices[0]
    assert sharded.items["parameters (fp32)"] == pytest.approx(4 * qwen3_4b.parameters / 8)
    assert sharded.items["reference model (compute dtype)"] == pytest.approx(2 * qwen3_4b.parameters / 8)
    offload_cfg = _policy(num_workers=8, dtensor_cfg={"enabled": True, "cpu_offload": True})
    offloaded = make_plan(offload_cfg, cluster, reference=True, shape=qwen3_4b).devices[0]
    assert "parameters (fp32)" not in offloaded.items and "parameters (fp32)" in offloaded.host_items
    assert offloaded.total_bytes < sharded.total_bytes


def test_activation_checkpointing_and_chunked_logprobs_shrink_what_a_micro_batch_costs(qwen3_4b):
    def total(**overrides) -> float:
        cfg = _policy(num_workers=7, dtensor_cfg={"enabled": True, **overrides.pop("dtensor", {})}, **overrides)
        return make_plan(cfg, ClusterConfig(), reference=False, shape=qwen3_4b).devices[0].total_bytes

    plain = total(dtensor={"activation_checkpointing": False})
    checkpointed = total(dtensor={"activation_checkpointing": True})
    chunked = total(dtensor={"activation_checkpointing": True}, logprob_chunk_size=1024)
    assert plain > 150 * GB > checkpointed > chunked + 40 * GB  # the fp32 logits of 32k x 152k tokens dominate
    assert chunked < 50 * GB


def _run_grpo_main(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    spec = importlib.util.spec_from_file_location("run_grpo", RUN_GRPO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from nemo_tau2.algorithms import grpo

    def must_not_start(*args, **kwargs):
        raise AssertionError("the run started although its plan does not fit")

    monkeypatch.setattr(grpo, "setup", must_not_start)
    monkeypatch.setattr(sys, "argv", ["run_grpo.py", *argv])
    code = module.main()
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("grpo_tau2_cpu_smoke.yaml", ["trainer rank (CPU) x 1", "from tiny_policy (built on first run)"]),
        ("grpo_tau2_qwen3_4b.yaml", ["4.02 B parameters", "trainer rank GPU x 7", "45.77 GB  total: fits"]),
        ("pivot_rl_tau2_qwen3_4b.yaml", ["4.02 B parameters", "trainer rank GPU x 7", "GPUs: 8 of 8"]),  # run_pivot_rl
        ("pivot_rl_tau2_cpu_smoke.yaml", ["trainer rank (CPU) x 1", "from tiny_policy (built on first run)"]),
        ("grpo_tau2_qwen3_8b.yaml", ["8.19 B parameters", "trainer rank GPU x 6", "vLLM GPU x 2", "GPUs: 8 of 8"]),
        (
            "grpo_tau2_qwen3_8b_megatron.yaml",
            [
                "Megatron rank GPU (TP 2, PP 1, first stage) x 6",
                "weights (bf16)",
                "fp32 master weights (over 3 DP rank(s))",
                "GPUs: 8 of 8",
            ],
        ),
        (
            "grpo_tau2_vllm_cpu_smoke.yaml",
            [
                "trainer rank (CPU) x 1",
                "(host memory less vLLM's)",
                "vLLM replica (CPU) x 1",
                "weights (float32)",
                "1.07 GB  KV cache (cpu_kvcache_space_gb)",
                "sequences of max_model_len 2048",
                "GPUs: 0",
            ],
        ),
    ],
)
def test_plan_prints_the_shipped_recipes_and_exits_0(monkeypatch, capsys, tmp_path, name, expected):
    config = ROOT / "examples" / "configs" / name
    code, out, err = _run_grpo_main(
        monkeypatch, capsys, "--config", str(config), "--plan", f"policy.model_name={tmp_path / 'tiny'}"
    ) if "smoke" in name else _run_grpo_main(monkeypatch, capsys, "--config", str(config), "--plan")  # fmt: skip
    assert code == 0, err
    torch_backend = [] if "megatron" in name else ["parameters (fp32)"]
    for text in [*expected, *torch_backend, "plan: fits", "activations", "logits"]:
        assert text in out, text


def test_vllm_on_cpu_takes_no_gpu_and_its_kv_cache_must_hold_one_sequence(qwen3_4b):
    vllm_cpu = {"backend": "vllm", "model_name": QWEN3_4B, "vllm_cfg": {"device": "cpu", "precision": "float32"}}
    cfg = _policy(device="cpu", num_workers=2, generation=vllm_cpu)
    plan = make_plan(cfg, ClusterConfig(gpus_per_node=1), reference=False, shape=qwen3_4b)
    trainer, vllm = plan.devices
    assert plan.gpus_needed == 0 and not vllm.on_gpu and vllm.count == 1
    assert vllm.items["weights (float32)"] == 4 * qwen3_4b.parameters
    assert vllm.items["KV cache (cpu_kvcache_space_gb)"] == 2 * 2**30  # the default 2 GiB
    assert trainer.budget_bytes == pytest.approx((vllm.budget_bytes - vllm.total_bytes) / 2)  # the host, shared
    # 262,144 positions of 36 blocks x 8 KV heads x 128 x fp32, K and V: 77 GB, far more than 2 GiB
    assert vllm.shortfall is not None and "cpu_kvcache_space_gb" in vllm.shortfall
    assert any(
        problem.startswith("on a vLLM CPU replica the KV cache holds 0.03 sequences") for problem in plan.problems
    )


def test_a_run_that_cannot_fit_is_refused_before_anything_starts_naming_what_to_change(monkeypatch, capsys):
    config = ROOT / "examples" / "configs" / "grpo_tau2_qwen3_4b.yaml"
    code, _, err = _run_grpo_main(
        monkeypatch, capsys, "--config", str(config), "policy.num_workers=1", "policy.dtensor_cfg.enabled=false"
    )
    assert code == 2
    error = err.strip().splitlines()[-1]
    assert error.startswith("error: the run cannot fit: a trainer rank needs")
    assert "policy.dtensor_cfg.enabled=true" in error and "policy.num_workers=7" in error


def test_plan_on_the_command_line_exits_2_for_the_4b_model_unsharded_on_one_rank():
    command = [sys.executable, str(RUN_GRPO), "--config", "examples/configs/grpo_tau2_qwen3_4b.yaml", "--plan",
               "policy.num_workers=1", "policy.dtensor_cfg.enabled=false"]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "DOES NOT FIT" in run.stdout and "change: policy.dtensor_cfg.enabled=true" in run.stdout
    assert "Traceback" not in run.stderr


def test_a_model_without_a_config_json_is_a_one_line_error(monkeypatch, capsys, tmp_path):
    config = ROOT / "examples" / "configs" / "grpo_tau2_qwen3_4b.yaml"
    code, _, err = _run_grpo_main(monkeypatch, capsys, "--config", str(config), "--plan",
                                  f"policy.model_name={tmp_path / 'nowhere'}")  # fmt: skip
    assert code == 2
    assert err.startswith("error: policy.model_name: no config.json for") and err.count("\n") == 1


def test_plan_prints_the_gym_capacity_section_of_the_4b_recipe(monkeypatch, capsys):
    """One vLLM GPU's policy turns against the recipe's one agent and one resources replica: enough, no warning."""
    config = ROOT / "examples" / "configs" / "grpo_tau2_qwen3_4b.yaml"
    code, out, err = _run_grpo_main(monkeypatch, capsys, "--config", str(config), "--plan")
    assert code == 0, err
    section = out.split("Gym capacity", 1)[1]
    expected = plan_gym_capacity(1, 1, 1)
    assert f"1 GPU(s) x 10,000 tokens/s / 135 tokens per turn = {expected.policy_turns_per_s:.0f} policy turns/s" in (
        section
    )
    assert (
        f"agent replicas: 1 configured x {expected.turns_per_s_per_replica['agent']:.0f} turns/s each, 1 needed"
        in (section)
    )
    assert "resources replicas: 1 configured" in section and "warning" not in out


def test_plan_warns_when_the_generation_gpus_outrun_the_configured_replicas(monkeypatch, capsys):
    config = ROOT / "examples" / "configs" / "grpo_tau2_qwen3_4b.yaml"
    sixteen_vllm_gpus = ["cluster.num_nodes=3", "policy.generation.vllm_cfg.data_parallel_size=16"]
    code, out, err = _run_grpo_main(monkeypatch, capsys, "--config", str(config), "--plan", *sixteen_vllm_gpus)
    assert code == 0, err  # exit status as before: too few replicas slow a run, they do not break it
    capacity = plan_gym_capacity(16, 1, 1)
    need = capacity.replicas_needed("agent")
    assert need == math.ceil(capacity.policy_turns_per_s * CPU_S_PER_POLICY_TURN["agent"]) > 1
    warnings = [line.strip() for line in out.splitlines() if line.strip().startswith("warning:")]
    carried = f"1 agent replica(s) carry {capacity.turns_per_s_per_replica['agent']:.0f} of the "
    carried += f"{capacity.policy_turns_per_s:.0f} policy turns/s"
    assert any(carried in w and f"set env.nemo_gym.agent_replicas={need} " in w for w in warnings), out
    enough = [*sixteen_vllm_gpus, "++cluster.gym_placement=ray", f"++env.nemo_gym.agent_replicas={need}",
              f"++env.nemo_gym.resources_replicas={capacity.replicas_needed('resources')}"]  # fmt: skip
    code, out, err = _run_grpo_main(monkeypatch, capsys, "--config", str(config), "--plan", *enough)
    assert code == 0, err
    assert "Gym capacity" in out and "warning" not in out


def test_megatron_splits_layers_and_vocab_over_tp_and_pp_and_the_optimizer_over_dp(qwen3_4b):
    """A Megatron rank of the first stage holds ceil(36 / PP) layers and the root, each over TP; the distributed
    optimizer puts master weights and moments over DP; sequence parallelism splits the rest of the activations."""

    def rank(tp: int, pp: int, **megatron) -> dict:
        cfg = _policy(num_workers=8, megatron_cfg={"enabled": True, "tensor_model_parallel_size": tp,
                                                   "pipeline_model_parallel_size": pp, **megatron})  # fmt: skip
        return make_plan(cfg, ClusterConfig(), reference=False, shape=qwen3_4b).devices[0].items

    blocks, root = qwen3_4b.block_parameters, qwen3_4b.root_parameters
    one, split = rank(1, 1), rank(2, 2)
    assert one["weights (bf16), 1/1 of 36 of 36 layers"] == 2 * qwen3_4b.parameters
    share = (blocks * 18 + root) / 2
    assert split["weights (bf16), 1/2 of 18 of 36 layers"] == pytest.approx(2 * share)
    assert split["optimizer state (8 B/param, over 2 DP rank(s))"] == pytest.approx(8 * share / 2)
    assert one["optimizer state (8 B/param, over 8 DP rank(s))"] == pytest.approx(8 * qwen3_4b.parameters / 8)
    replicated = rank(2, 2, optimizer={"use_distributed_optimizer": False})
    assert replicated["optimizer state (8 B/param, over 1 DP rank(s))"] == pytest.approx(8 * share)

    def activations(items: dict) -> float:
        return next(value for name, value in items.items() if name.startswith("activations"))

    # 1F1B keeps PP micro-batches of 1/PP of the layers: PP alone does not shrink the first stage's activations
    assert activations(rank(1, 2)) == pytest.approx(activations(one))
    assert activations(one) > activations(rank(2, 1)) > activations(rank(2, 1, sequence_parallel=True))
    assert activations(rank(2, 1, sequence_parallel=True)) == pytest.approx(activations(one) / 2)
    # packed: a micro-batch is sequence_packing.train_mb_tokens, not micro-batch size x max length
    packed = _policy(megatron_cfg={"enabled": True}, sequence_packing={"enabled": True, "train_mb_tokens": 65536})
    items = make_plan(packed, ClusterConfig(), reference=False, shape=qwen3_4b).devices[0].items
    assert activations(items) == pytest.approx(activations(rank(1, 1)) * 2)
    # the reference model: host memory, swapped in by the worker (MegatronPolicyWorker.get_reference_logprobs)
    cfg = _policy(num_workers=8, megatron_cfg={"enabled": True, "tensor_model_parallel_size": 2})
    with_reference = make_plan(cfg, ClusterConfig(), reference=True, shape=qwen3_4b).devices[0]
    without = make_plan(cfg, ClusterConfig(), reference=False, shape=qwen3_4b).devices[0]
    assert with_reference.total_bytes == without.total_bytes
    assert sum(with_reference.host_items.values()) == pytest.approx(2 * 2 * qwen3_4b.parameters / 2)
