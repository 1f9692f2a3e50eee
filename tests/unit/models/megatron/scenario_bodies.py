"""Scenario bodies run inside a spawned gloo process (see :mod:`scenarios`); each returns what its test asserts."""

import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from nemo_tau2.models.megatron import conversion
from nemo_tau2.models.megatron.hf_weights import full_hf_state, load_hf_state, read_hf_state, save_hf_folder
from nemo_tau2.models.megatron.model import build_gpt_model, hf_vocab_logits, transformer_config
from nemo_tau2.models.megatron.parallel import destroy_megatron, initialize_megatron
from tests.unit.models.megatron.scenario_packed import RowSquares, packed_attention, packed_attention_tp2  # noqa: F401
from tests.unit.models.megatron.scenarios import tiny_hf_model


def _tokens(batch: int = 2, length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 96, (batch, length), generator=torch.Generator().manual_seed(1))
    return ids, torch.arange(length).expand(batch, length)


@torch.no_grad()
def _megatron_logits(model, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return model(ids, positions, None)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def _build(hf_config, tp: int = 1):
    return build_gpt_model(hf_config, transformer_config(hf_config, tensor_model_parallel_size=tp)).eval()


def conversion_single(tmp: Path) -> dict:
    initialize_megatron(1, 1, seed=0)
    results = {}
    ids, positions = _tokens()
    for model_type in ("qwen3", "llama"):
        hf_model, hf_config = tiny_hf_model(model_type)
        hf_model.save_pretrained(tmp / model_type)
        hf_state = read_hf_state(tmp / model_type)
        with torch.no_grad():
            expected = hf_model(ids).logits
        model = _build(hf_config)
        load_hf_state(model, hf_state, hf_config)
        back = full_hf_state(model, hf_config)
        results[model_type] = {
            "round_trip_names_equal": sorted(back) == sorted(hf_state),
            "round_trip_max_abs_diff": max(_max_diff(back[name], hf_state[name]) for name in hf_state),
            "logits_max_abs_diff": _max_diff(_megatron_logits(model, ids, positions), expected),
            "logits_scale": expected.abs().mean().item(),
        }
        exported = save_hf_folder(model, hf_config, tmp / f"{model_type}_export")
        reloaded = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            results[model_type]["export_reload_max_abs_diff"] = _max_diff(reloaded(ids).logits, expected)
        results[model_type]["export_files"] = sorted(path.name for path in exported.iterdir())
        if model_type == "qwen3":  # the plausible bug: q, k, v stacked as three blocks, not per query group
            right = conversion.fuse_qkv
            conversion.fuse_qkv = lambda q, k, v, config: torch.cat([q, k, v], dim=0)
            try:
                load_hf_state(model, hf_state, hf_config)
            finally:
                conversion.fuse_qkv = right
            wrong = _megatron_logits(model, ids, positions)
            results[model_type]["wrong_qkv_logits_max_abs_diff"] = _max_diff(wrong, expected)
    destroy_megatron()
    return results


def conversion_tp2(tmp: Path) -> dict:
    initialize_megatron(2, 1, seed=0)
    hf_model, hf_config = tiny_hf_model("qwen3")
    if dist.get_rank() == 0:
        hf_model.save_pretrained(tmp / "hf")
    dist.barrier()
    hf_state = read_hf_state(tmp / "hf")
    model = _build(hf_config, tp=2)
    load_hf_state(model, hf_state, hf_config)
    ids, positions = _tokens()
    with torch.no_grad():
        expected = hf_model(ids).logits
    logits = _megatron_logits(model, ids, positions)
    back = full_hf_state(model, hf_config)
    destroy_megatron()
    if back is None:
        return {}
    return {
        "logits_max_abs_diff": _max_diff(logits, expected),
        "export_max_abs_diff": max(_max_diff(back[name], hf_state[name]) for name in hf_state),
    }


def _training_config(model_dir: Path, tp: int, pp: int, packed: bool = False, precision: str = "float32"):
    from nemo_tau2.models.policy import PolicyConfig

    return PolicyConfig(
        model_name=str(model_dir),
        precision=precision,
        train_global_batch_size=4,
        train_micro_batch_size=2,
        max_total_sequence_length=64,
        max_grad_norm=1.0,
        num_workers=dist.get_world_size(),
        sequence_packing={"enabled": packed},
        megatron_cfg={
            "enabled": True,
            "tensor_model_parallel_size": tp,
            "pipeline_model_parallel_size": pp,
            "optimizer": {"lr": 1e-4, "min_lr": 0.0, "weight_decay": 0.0},
        },  # fmt: skip
    )


TRAIN_STEPS = 3


def _bf16_representable(model) -> None:
    """Round the weights to bf16 values (kept fp32): both backends then start from the same weights in bf16, as
    they do from a released bf16 checkpoint."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).float())


def training(tmp: Path, tp: int = 1, pp: int = 1, with_plain_reference: bool = False, packed: bool = False,
             precision: str = "float32") -> dict:  # fmt: skip
    """3 optimizer steps of the clipped PG loss on 4 episodes with the Megatron backend (and, on request, the same
    with the torch Policy in this process, from the same weights); ``packed``: each micro-batch one packed row."""
    from megatron.core import parallel_state

    from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_tau2.generation.tiny_model import build_tiny_tokenizer
    from nemo_tau2.models.megatron.training import build_stack, get_logprobs, train_global_batch
    from nemo_tau2.models.policy.data import collate
    from nemo_tau2.models.policy.lm_policy import global_normalisers
    from tests.unit.models.policy.conftest import make_sequences

    tokenizer = build_tiny_tokenizer()
    hf_model, _ = tiny_hf_model("qwen3", vocab_size=len(tokenizer))  # 591: padded to 640 (TP=1) or 768 (TP=2)
    if precision == "bfloat16":
        _bf16_representable(hf_model)
    if dist.get_rank() == 0:
        hf_model.save_pretrained(tmp / "hf")
        tokenizer.save_pretrained(tmp / "hf")
    dist.barrier()
    cfg = _training_config(tmp / "hf", tp, pp, packed, precision)
    initialize_megatron(tp, pp, seed=0)
    stack = build_stack(cfg, str(tmp / "hf"))
    pad = tokenizer.pad_token_id
    sequences = make_sequences(4)
    dp_rank, dp_size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
    mine = sequences[dp_rank::dp_size]
    micro = [collate(mine[i : i + 2], pad, packed=packed) for i in range(0, len(mine), 2)]
    recorder = RowSquares(max(b.packed.input_ids.shape[1] for b in micro)) if packed and tp == 1 else None
    recorder = recorder or contextlib.nullcontext()
    with recorder:  # packed: every N x N tensor over the row (there must be none)
        logprobs = get_logprobs(stack, micro, pad)
    result = {}
    if packed:  # the worker's padding micro-batch of a rank without data (a row of 2 pad tokens) beside a real one
        from nemo_tau2.models.megatron.worker import MegatronPolicyWorker

        with_empty, _ = MegatronPolicyWorker(cfg, tokenizer=tokenizer)._batches([mine[:2], []])
        result["with_empty_micro_batch"] = get_logprobs(stack, with_empty, pad)
    for seq, prev in zip(mine, logprobs, strict=True):
        seq.prev_logprobs = prev
    micro = [collate(mine[i : i + 2], pad, packed=packed) for i in range(0, len(mine), 2)]
    loss_fn = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))
    valid_toks, valid_seqs = global_normalisers(sequences)
    with recorder:
        steps = [train_global_batch(stack, micro, loss_fn, valid_toks, valid_seqs, pad) for _ in range(TRAIN_STEPS)]
    if isinstance(recorder, RowSquares):
        result |= {"row_squares": recorder.squares, "row_tensors": recorder.row_tensors}
    result |= {"losses": [s["loss"] for s in steps], "grad_norms": [s["grad_norm"] for s in steps],
               "logprobs": logprobs if dp_rank == 0 else None,
               "weight_dtypes": sorted({str(p.dtype) for p in stack.gpt_model.parameters()}),
               "master_dtypes": sorted({str(p.dtype) for group in stack.optimizer.optimizer.param_groups
                                        for p in group["params"]})}  # fmt: skip
    # the trained weights leave as an HF folder (rank 0 writes it): transformers' logits of it, and Megatron's own
    exported = save_hf_folder(stack.gpt_model, stack.hf_config, tmp / "export")
    ids, positions = _tokens()
    ids = ids * 5  # spread over the 591-token vocabulary
    if dp_size == dist.get_world_size():  # one whole model per rank: its own logits are comparable
        result["megatron_logits"] = hf_vocab_logits(_megatron_logits(stack.gpt_model, ids, positions), stack.hf_config)
    if exported is not None:
        reloaded = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():
            result["export_logits"] = reloaded(ids).logits
    destroy_megatron()
    if with_plain_reference:
        result["plain"] = _plain_reference(tmp, hf_model, tokenizer, sequences, loss_fn, packed, precision)
    return result


def _plain_reference(tmp: Path, hf_model, tokenizer, sequences, loss_fn, packed: bool, precision: str) -> dict:
    from nemo_tau2.models.policy import PolicyConfig
    from nemo_tau2.models.policy.lm_policy import Policy

    cfg = PolicyConfig(
        model_name=str(tmp / "hf"),
        precision=precision,
        train_global_batch_size=4,
        train_micro_batch_size=2,
        max_total_sequence_length=64,
        max_grad_norm=1.0,
        sequence_packing={"enabled": packed},
        optimizer={"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-4, "weight_decay": 0.0}},
    )
    policy = Policy(cfg, model=hf_model, tokenizer=tokenizer)
    for seq in sequences:
        seq.prev_logprobs = None
    logprobs = policy.get_logprobs(sequences)
    for seq, prev in zip(sequences, logprobs, strict=True):
        seq.prev_logprobs = prev
    losses = [policy.train(sequences, loss_fn) for _ in range(TRAIN_STEPS)]
    return {"losses": [m["loss"] for m in losses], "grad_norms": [m["grad_norm"] for m in losses],
            "logprobs": logprobs}  # fmt: skip


def training_single(tmp: Path) -> dict:
    return training(tmp, with_plain_reference=True)


def training_bf16(tmp: Path) -> dict:
    """The single-process run in bf16 (Float16Module, fp32 masters) beside the torch Policy in bf16 (autocast)."""
    return training(tmp, with_plain_reference=True, precision="bfloat16")


def training_packed(tmp: Path) -> dict:
    return training(tmp, with_plain_reference=True, packed=True)


def training_dp2(tmp: Path) -> dict:
    return training(tmp)


def training_tp2(tmp: Path) -> dict:
    return training(tmp, tp=2)


def training_pp2(tmp: Path) -> dict:
    return training(tmp, pp=2)


def training_tp2_packed(tmp: Path) -> dict:
    return training(tmp, tp=2, packed=True)


def training_pp2_packed(tmp: Path) -> dict:
    return training(tmp, pp=2, packed=True)  # 2 packed rows of 39 and 48 tokens: padded to one N


def checkpoint_resume(tmp: Path, distributed_optimizer: bool = True, precision: str = "float32",
                      fully_reshardable: bool = True, resume_in: tuple = ((1, 1),)) -> dict:  # fmt: skip
    """DP=2 with the distributed optimizer (or a replicated one), an LR warm-up and weight decay: 2 steps, save,
    2 more (the uninterrupted run); then megatron-core's state torn down and, for each ``(TP, PP)`` of
    ``resume_in``, a stack built afresh from the HF weights in that layout loads the checkpoint and takes the same
    2 steps."""
    from megatron.core import parallel_state

    from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_tau2.generation.tiny_model import build_tiny_tokenizer
    from nemo_tau2.models.megatron.checkpoint import load_megatron_checkpoint, save_megatron_checkpoint
    from nemo_tau2.models.megatron.training import build_stack, train_global_batch
    from nemo_tau2.models.policy.data import collate
    from nemo_tau2.models.policy.lm_policy import global_normalisers
    from tests.unit.models.policy.conftest import make_sequences

    tokenizer = build_tiny_tokenizer()
    hf_model, _ = tiny_hf_model("qwen3", vocab_size=len(tokenizer))
    if dist.get_rank() == 0:
        hf_model.save_pretrained(tmp / "hf")
        tokenizer.save_pretrained(tmp / "hf")
    dist.barrier()

    def config(tp: int, pp: int):
        cfg = _training_config(tmp / "hf", tp, pp, precision=precision)
        cfg.megatron_cfg.optimizer.weight_decay = 0.1
        cfg.megatron_cfg.optimizer.use_distributed_optimizer = distributed_optimizer
        cfg.megatron_cfg.optimizer.dist_ckpt_optim_fully_reshardable = fully_reshardable
        cfg.megatron_cfg.scheduler.lr_warmup_iters = 6  # the LR of every step depends on the schedule's position
        cfg.megatron_cfg.scheduler.lr_decay_iters = 10
        return cfg

    pad = tokenizer.pad_token_id
    sequences = make_sequences(4)
    for seq in sequences:
        seq.prev_logprobs = list(seq.generation_logprobs)
    loss_fn = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))
    valid_toks, valid_seqs = global_normalisers(sequences)

    def steps(stack, count: int) -> list[dict]:
        rank, size = parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()
        micro = [collate(sequences[rank::size], pad)]
        out = [train_global_batch(stack, micro, loss_fn, valid_toks, valid_seqs, pad) for _ in range(count)]
        return [{"loss": s["loss"], "grad_norm": s["grad_norm"], "lr": s["lr"]} for s in out]

    initialize_megatron(1, 1, seed=0)
    stack = build_stack(config(1, 1), str(tmp / "hf"))
    before = steps(stack, 2)
    save_megatron_checkpoint(stack, tmp / "ckpt")
    scheduler_state = stack.scheduler.state_dict()
    uninterrupted = steps(stack, 2)
    weights = {name: p.detach().clone() for name, p in stack.gpt_model.named_parameters()}
    destroy_megatron()
    result = {"before": before, "uninterrupted": uninterrupted,
              "files": sorted(p.name for p in (tmp / "ckpt").iterdir())}  # fmt: skip
    for tp, pp in resume_in:
        initialize_megatron(tp, pp, seed=0)
        fresh = build_stack(config(tp, pp), str(tmp / "hf"))
        load_megatron_checkpoint(fresh, tmp / "ckpt", scheduler_state)
        result[f"resumed_tp{tp}_pp{pp}"] = steps(fresh, 2)
        if (tp, pp) == (1, 1):
            result["max_weight_diff"] = max(
                (p.detach() - weights[name]).abs().max().item() for name, p in fresh.gpt_model.named_parameters()
            )
        destroy_megatron()
    return result


def checkpoint_resume_replicated_optimizer(tmp: Path) -> dict:
    return checkpoint_resume(tmp, distributed_optimizer=False)


def checkpoint_resume_dp_reshardable(tmp: Path) -> dict:
    return checkpoint_resume(tmp, fully_reshardable=False)


def checkpoint_reshard(tmp: Path) -> dict:
    """The DP=2 checkpoint (fully_reshardable) resumed at TP=2 (its vocabulary padded to 768 rows, not 640) and
    at PP=2."""
    return checkpoint_resume(tmp, resume_in=((2, 1), (1, 2)))


def checkpoint_resume_bf16(tmp: Path) -> dict:
    """bf16 weights with fp32 masters in the distributed optimizer: a resume that lost the masters (rebuilt from the
    bf16 weights) would take other steps."""
    return checkpoint_resume(tmp, precision="bfloat16")


def _in_sequence(tmp: Path, names: list[str]) -> dict:
    """Several scenarios in the same processes, one after the other (each sets up and destroys megatron-core's
    parallel state), in folders of their own: one spawn pays the imports once."""
    results = {}
    for name in names:
        folder = tmp / name
        folder.mkdir(exist_ok=True)
        dist.barrier()
        results[name] = globals()[name](folder)
    return results


def one_process(tmp: Path) -> dict:
    return _in_sequence(
        tmp, ["conversion_single", "training_single", "training_packed", "training_bf16", "packed_attention"]
    )


def two_processes(tmp: Path) -> dict:
    return _in_sequence(
        tmp,
        [
            "conversion_tp2",
            "training_dp2",
            "training_tp2",
            "training_pp2",
            "training_tp2_packed",
            "training_pp2_packed",
            "packed_attention_tp2",
            "checkpoint_resume",
            "checkpoint_resume_replicated_optimizer",
            "checkpoint_resume_dp_reshardable",
            "checkpoint_resume_bf16",
            "checkpoint_reshard",
        ],
    )
