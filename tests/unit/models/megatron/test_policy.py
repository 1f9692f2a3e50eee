"""``Policy`` with ``policy.megatron_cfg.enabled``: the Megatron worker (one Ray actor, gloo, CPU mode, sequence
packing on) behind the interface the GRPO loop uses gives the torch Policy's (padded) logprobs, loss trajectory and
metrics on the tiny Llama (tied head, 591-token vocabulary), keeps the initial weights as its reference model, and
exports weights (stream and HF folder) that transformers loads with the trained logits. DP=2 (padded rows), TP=2
(the vocabulary padded to 768) and PP=2 on 2 actors give the 1-rank logprobs, trajectory and export. A DP=2
checkpoint resumes in fresh actors with the uninterrupted run's losses and weights, and at TP=2 and PP=2; a
checkpoint of the other backend is refused in one line. In bf16 (1 actor) it trains, keeps its reference and
streams bf16 weights.

One Ray start for the module: the fixture runs the whole exchange once and the tests read its results.
"""

import copy
import importlib.util

import pytest
import ray
import torch
from transformers import AutoModelForCausalLM

from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
from nemo_tau2.generation.tiny_model import build_tiny_model
from nemo_tau2.models.policy import PolicyConfig, step_dir
from nemo_tau2.models.policy.checkpoint import CheckpointMismatchError
from nemo_tau2.models.policy.lm_policy import Policy
from tests.torch_threads import _one_torch_thread  # noqa: F401  (autouse)
from tests.unit.models.policy.conftest import make_sequences

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="needs the megatron extra (uv sync --extra megatron)"
)

LOGPROB_TOLERANCE = 1e-5  # fp32; Megatron's attention and HF's eager attention round differently
LOSS_TOLERANCE = 1e-5  # per step, on losses of order 0.1
LOGITS_TOLERANCE = 1e-4  # the exported weights vs the torch Policy's after 2 steps at lr 1e-3 (fp32)
TRAIN_STEPS = 2
SPLITS = {"tp2": {"tensor_model_parallel_size": 2}, "pp2": {"pipeline_model_parallel_size": 2}}
NO_KL = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))


def _config(megatron: bool, num_workers: int = 1, packed: bool = False, precision: str = "float32",
            **parallel: int) -> PolicyConfig:  # fmt: skip
    fields = {
        "num_workers": num_workers,
        "precision": precision,
        "model_name": "tiny",
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "max_total_sequence_length": 64,
        "max_grad_norm": 1.0,
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-3, "weight_decay": 0.0}},
        "sequence_packing": {"enabled": packed},
    }
    if megatron:
        fields["megatron_cfg"] = {"enabled": True, "optimizer": {"lr": 1e-3, "min_lr": 0.0, "weight_decay": 0.0},
                                  **parallel}  # fmt: skip
    return PolicyConfig(**fields)


def _exchange(policy: Policy, tmp_path) -> dict:
    """What the GRPO loop does with a Policy: logprobs, reference logprobs, 2 training steps, weights out."""
    sequences = make_sequences(5)  # 5 over 2-sequence micro-batches: one micro-batch holds a single sequence
    logprobs = policy.get_logprobs(sequences)
    for seq, prev in zip(sequences, logprobs, strict=True):
        seq.prev_logprobs = prev
    metrics = [policy.train(sequences[:4], NO_KL) for _ in range(TRAIN_STEPS)]
    result = {"logprobs": logprobs, "metrics": metrics, "after": policy.get_logprobs(sequences)}
    if policy.has_reference_model:
        result["reference"] = policy.get_reference_policy_logprobs(sequences)
    result["stream"] = {name: tensor.clone() for name, tensor in policy.stream_weights_for_generation()}
    result["export"] = policy.save_hf_model(tmp_path / "export")
    return result


def _two_more_steps(policy: Policy) -> dict:
    sequences = make_sequences(4)
    for seq in sequences:
        seq.prev_logprobs = list(seq.generation_logprobs)
    metrics = [policy.train(sequences, NO_KL) for _ in range(TRAIN_STEPS)]
    return {"metrics": metrics, "weights": {name: t.clone() for name, t in policy.stream_weights_for_generation()}}


def _refusal(policy: Policy, checkpoint) -> str:
    with pytest.raises(CheckpointMismatchError) as refused:
        policy.load_checkpoint(checkpoint)
    return str(refused.value)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tiny = build_tiny_model(seed=0)
    torch_run = Policy(_config(False), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer)
    plain = _exchange(torch_run, tmp_path_factory.mktemp("torch"))
    torch_checkpoint = torch_run.save_checkpoint(step_dir(tmp_path_factory.mktemp("torch_ckpt"), 2), {"step": 2})
    refusals = {}
    # one Ray for the Megatron Policies (each leaves it running); "local": never another test process's cluster
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        with Policy(_config(True, packed=True), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer,
                    init_reference_model=True) as policy:  # fmt: skip
            megatron = _exchange(policy, tmp_path_factory.mktemp("megatron"))
            [(batches, _)] = policy._workers.run("_batches", [([make_sequences(2)],)])
            megatron["packed_row"] = batches[0].packed
            refusals["torch_into_megatron"] = _refusal(policy, torch_checkpoint)
        with Policy(_config(True, packed=True, precision="bfloat16"), model=copy.deepcopy(tiny.model),
                    tokenizer=tiny.tokenizer, init_reference_model=True) as policy:  # fmt: skip
            bf16 = _exchange(policy, tmp_path_factory.mktemp("bf16"))
        # DP=2: 2 ranks, each its own plan; 5 sequences for logprobs leave one rank an empty (padding) micro-batch
        with Policy(_config(True, num_workers=2), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer) as dp2:
            data_parallel = _exchange(dp2, tmp_path_factory.mktemp("dp2"))
            saved = dp2.save_checkpoint(step_dir(tmp_path_factory.mktemp("dp2_ckpt"), 2), {"step": 2, "pos": 8})
            uninterrupted = _two_more_steps(dp2)
        splits = {}  # TP=2 (the 591-token vocabulary padded to 768) and PP=2 (one layer per stage), DP=1
        for name, sizes in SPLITS.items():
            with Policy(_config(True, num_workers=2, **sizes), model=copy.deepcopy(tiny.model),
                        tokenizer=tiny.tokenizer) as split:  # fmt: skip
                splits[name] = _exchange(split, tmp_path_factory.mktemp(name))
                split.load_checkpoint(saved)  # the DP=2 checkpoint in this layout (TP=2: 768 vocabulary rows)
                splits[name]["resumed"] = _two_more_steps(split)
        # fresh actors (fresh processes) from the initial weights, as a resumed run builds them
        with Policy(_config(True, num_workers=2), model=copy.deepcopy(tiny.model), tokenizer=tiny.tokenizer) as again:
            trainer_state = again.load_checkpoint(saved)
            resumed = _two_more_steps(again)
    finally:
        ray.shutdown()
    refusals["megatron_into_torch"] = _refusal(torch_run, saved)
    files = sorted(str(path.relative_to(saved)) for path in saved.rglob("*"))
    return {"torch": plain, "megatron": megatron, "dp2": data_parallel, "tokenizer": tiny.tokenizer,
            "uninterrupted": uninterrupted, "resumed": resumed, "trainer_state": trainer_state, "checkpoint": files,
            "refusals": refusals, "bf16": bf16, **splits}  # fmt: skip


def _max_diff(rows_a: list[list[float]], rows_b: list[list[float]]) -> float:
    assert [len(row) for row in rows_a] == [len(row) for row in rows_b]
    return max(abs(a - b) for x, y in zip(rows_a, rows_b, strict=True) for a, b in zip(x, y, strict=True))


def test_logprobs_before_and_after_training_agree_with_the_torch_policy(runs):
    """The Megatron worker runs packed rows (one per micro-batch), the torch Policy padded ones."""
    megatron, plain = runs["megatron"], runs["torch"]
    assert megatron["packed_row"] is not None and megatron["packed_row"].input_ids.shape == (1, 18 + 21)
    assert _max_diff(megatron["logprobs"], plain["logprobs"]) < LOGPROB_TOLERANCE
    assert _max_diff(megatron["after"], plain["after"]) < LOGPROB_TOLERANCE
    assert _max_diff(megatron["after"], megatron["logprobs"]) > 1e-3  # the 2 steps moved the weights


def test_loss_trajectory_and_metrics_agree_with_the_torch_policy(runs):
    megatron, plain = runs["megatron"]["metrics"], runs["torch"]["metrics"]
    assert [m["loss"] for m in megatron] == pytest.approx([m["loss"] for m in plain], abs=LOSS_TOLERANCE)
    assert len({m["loss"] for m in megatron}) == TRAIN_STEPS
    for got, expected in zip(megatron, plain, strict=True):
        for key in ("grad_norm", "entropy", "pg_loss", "num_valid_tokens", "global_valid_toks", "lr"):
            assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key
        assert got["num_optimizer_steps"] == 1.0


def test_reference_logprobs_are_the_initial_ones_after_training(runs):
    megatron = runs["megatron"]
    assert megatron["reference"] == megatron["logprobs"]


def test_exported_weights_load_in_transformers_with_the_trained_logits(runs):
    megatron, plain = runs["megatron"], runs["torch"]
    assert sorted(megatron["stream"]) == sorted(plain["stream"])  # every name the hf engine checks, tied head too
    reloaded = AutoModelForCausalLM.from_pretrained(megatron["export"], dtype=torch.float32, local_files_only=True)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, megatron["stream"][name]), name
    expected = AutoModelForCausalLM.from_pretrained(plain["export"], dtype=torch.float32, local_files_only=True)
    ids = torch.tensor([make_sequences(1)[0].token_ids])
    with torch.no_grad():
        got, want = reloaded(ids).logits, expected(ids).logits
    assert (got - want).abs().max().item() < LOGITS_TOLERANCE
    assert runs["tokenizer"].get_vocab() == type(runs["tokenizer"]).from_pretrained(megatron["export"]).get_vocab()


def test_a_bf16_policy_trains_keeps_its_reference_and_streams_its_bf16_weights(runs):
    """``policy.precision=bfloat16`` behind ``Policy``: the reference model (initial bf16 weights swapped in and out)
    gives the initial logprobs exactly after training; the stream carries the bf16 weights the forward computes with,
    and the HF export holds them; it stays near the fp32 run (measured: logprobs 2.9e-3 away, fp32's own agreement
    being ~1e-6; losses within 7e-4)."""
    bf16, fp32 = runs["bf16"], runs["megatron"]
    assert bf16["reference"] == bf16["logprobs"] and _max_diff(bf16["after"], bf16["logprobs"]) > 1e-2
    assert 1e-4 < _max_diff(bf16["logprobs"], fp32["logprobs"]) < 0.05  # bf16 compute, bf16 rounding of weights
    losses = [m["loss"] for m in bf16["metrics"]]
    assert losses == pytest.approx([m["loss"] for m in fp32["metrics"]], abs=0.01) and len(set(losses)) == TRAIN_STEPS
    assert {tensor.dtype for tensor in bf16["stream"].values()} == {torch.bfloat16}
    reloaded = AutoModelForCausalLM.from_pretrained(bf16["export"], dtype=torch.bfloat16, local_files_only=True)
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, bf16["stream"][name]), name


def test_two_data_parallel_ranks_give_the_single_rank_logprobs_and_trajectory(runs):
    dp2, single = runs["dp2"], runs["megatron"]
    assert _max_diff(dp2["logprobs"], single["logprobs"]) < LOGPROB_TOLERANCE
    assert _max_diff(dp2["after"], single["after"]) < LOGPROB_TOLERANCE
    for got, expected in zip(dp2["metrics"], single["metrics"], strict=True):
        assert got["loss"] == pytest.approx(expected["loss"], abs=LOSS_TOLERANCE)
        assert got["num_valid_tokens"] == expected["num_valid_tokens"]  # each rank's metrics counted once
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_tensor_and_pipeline_parallel_policies_give_the_single_rank_logprobs_trajectory_and_export(runs, split):
    """2 Ray actors as TP=2 or PP=2: the 1-rank Megatron Policy's (and the torch Policy's) logprobs before and after
    2 steps, losses, grad norms and entropy; the exported HF folder has exactly the HF shapes (the padded vocabulary
    rows dropped) and the 1-rank export's weights."""
    got, single, plain = runs[split], runs["megatron"], runs["torch"]
    for reference in (single, plain):
        assert _max_diff(got["logprobs"], reference["logprobs"]) < LOGPROB_TOLERANCE
        assert _max_diff(got["after"], reference["after"]) < LOGPROB_TOLERANCE
        for mine, theirs in zip(got["metrics"], reference["metrics"], strict=True):
            assert mine["loss"] == pytest.approx(theirs["loss"], abs=LOSS_TOLERANCE)
            for key in ("grad_norm", "entropy", "num_valid_tokens"):
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-7), key
    exported = AutoModelForCausalLM.from_pretrained(got["export"], dtype=torch.float32, local_files_only=True)
    expected = AutoModelForCausalLM.from_pretrained(single["export"], dtype=torch.float32, local_files_only=True)
    want = expected.state_dict()
    assert sorted(got["stream"]) == sorted(want)
    for name, tensor in exported.state_dict().items():
        assert tensor.shape == want[name].shape and torch.equal(tensor, got["stream"][name]), name
        assert (tensor - want[name]).abs().max().item() < 1e-5, name


def test_a_dp2_checkpoint_resumes_in_fresh_actors_with_the_uninterrupted_losses_and_weights(runs):
    resumed, uninterrupted = runs["resumed"], runs["uninterrupted"]
    for got, expected in zip(resumed["metrics"], uninterrupted["metrics"], strict=True):
        for key in ("loss", "grad_norm", "lr", "num_valid_tokens"):
            assert got[key] == pytest.approx(expected[key], abs=1e-9), key  # measured: bit-exact on CPU
    assert sorted(resumed["weights"]) == sorted(uninterrupted["weights"])
    for name, tensor in resumed["weights"].items():
        assert (tensor - uninterrupted["weights"][name]).abs().max().item() <= 1e-9, name
    assert runs["trainer_state"] == {"step": 2, "pos": 8}
    assert {"megatron/metadata.json", "megatron/layout.json", "scheduler.pt", "rng_state.pt",
            "hf_config/config.json", "trainer_state.json"} <= set(runs["checkpoint"])  # fmt: skip
    assert not any(name.startswith("policy") for name in runs["checkpoint"])


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_the_dp2_checkpoint_resumes_at_tp2_and_pp2_with_the_uninterrupted_losses_and_weights(runs, split):
    """Resharded on load (``fully_reshardable``, the default): to float rounding, sums being ordered otherwise."""
    resumed, uninterrupted = runs[split]["resumed"], runs["uninterrupted"]
    for got, expected in zip(resumed["metrics"], uninterrupted["metrics"], strict=True):
        assert got["loss"] == pytest.approx(expected["loss"], abs=LOSS_TOLERANCE)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], rel=1e-5)
        assert got["lr"] == expected["lr"]
    for name, tensor in resumed["weights"].items():
        assert (tensor - uninterrupted["weights"][name]).abs().max().item() < 1e-5, name


def test_a_checkpoint_of_the_other_backend_is_refused_in_one_line(runs):
    refusals = runs["refusals"]
    assert (
        "written by the torch backend (policy/), this run trains with the Megatron backend"
        in (refusals["torch_into_megatron"])
    )
    assert (
        "written by the Megatron backend (megatron/), this run trains with the torch backend"
        in (refusals["megatron_into_torch"])
    )
    assert all("\n" not in message for message in refusals.values())
