"""The GPU kit's check: our trainer's GRPO step and the hf engine's generation on one bare CUDA device, measured.

Per Qwen3 shape (``--shapes``, from ``nemo_tau2/models/hf_configs/``; random weights, nothing downloaded) it runs the
trainer's own code path through ``lm_policy.Policy``: FSDP2 over the one device (a one-rank
process group, as ``dtensor_cfg.enabled`` runs it), bf16 compute with fp32 master weights, activation checkpointing,
packed micro-batches of tau2-like episodes (the test split's length mix, the longest 32k tokens), the fp32
log-softmax 1,024 positions at a time, the reference model, ``get_logprobs`` + ``get_reference_policy_logprobs`` +
``train`` with the recipe's ``ClippedPGLossFn`` (KL, importance correction), clip and AdamW step. Then:

- **micro-batch ladder**: one step per token budget (4k .. ``--max-tokens``), largest that fits, and the peak memory
  of each against the memory plan's estimate for it (``ratio`` = measured / estimated; the measured peak is the
  allocator's peak reservation plus what the process holds outside it: CUDA context, NCCL, cuBLAS workspace);
- **speed** at the recipe's 32k-token micro-batch (or the largest that fits): median of ``--steps`` steps, trained
  tokens/s and MFU against the card's dense bf16 peak. Model FLOPs per micro-batch, forward:
  ``2 N T + 2 L d sum(len_i^2)`` (``N`` matmul weights, ``T`` tokens, ``L`` layers, ``d`` attention width; causal
  attention within each packed sequence); a training step counts 3x (recomputation not counted, as MFU does);
- a shape whose plan cannot fit one device (16 bytes per parameter of fp32 weights, gradients and AdamW state) runs
  with fewer layers, the most that the plan fits (``layers`` of ``layers_full``): per-layer cost and MFU carry over;
- **generation**: the hf engine (continuous batching, bf16, full depth) at 1, 8 and 32 concurrent requests: generated
  tokens/s, a floor for the rollout side (vLLM cannot reach the kit's machine);
- **Megatron** (``--backends``; default ``torch,megatron``): the Megatron backend's step at the timed micro-batch from
  the same initial weights, its logprobs against the torch path's (``megatron_*`` fields, ``gpu_check_megatron.py``).

One JSON line per shape, written whole and flushed as the shape completes (a run killed later keeps it), then the
summary (last line) with the memory plan's calibration: ``--write-calibration FILE`` stores it
(``nemo_tau2/models/memory_calibration.py``). ``--budget-s`` (default 480) skips the units of work that would overrun
it, naming them in the record's ``skipped`` (``gpu_check_run.py``). ``--dry-run`` runs the same path on CPU in fp32, a
tiny Qwen3 shape (CI). Import closure: the trainer core (torch, transformers, pydantic, megatron-core; no Ray,
NeMo-Gym, tau2, vLLM, omegaconf or litellm), so it runs on a torch-only machine (docs/gpu-kit.md).

    python bench/gpu_check.py --dry-run
    python bench/gpu_check.py --shapes 0.6b,1.7b --out gpu_check.jsonl --write-calibration calibration.json
"""

import argparse
import datetime
import functools
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from gpu_check_generation import generation_speed
from gpu_check_levers import measure_levers
from gpu_check_megatron import HEADER, MEGATRON_SUMMARY, measure_megatron, megatron_columns, megatron_missing
from gpu_check_run import Budget, PeakMemory, grpo_step, kit_commit, one_line, project_commit
from transformers import AutoConfig, AutoModelForCausalLM

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
from nemo_tau2.generation.tiny_model import build_tiny_tokenizer
from nemo_tau2.models.memory_calibration import PeakMeasurement, calibration_report, kit_policy_config, with_blocks
from nemo_tau2.models.memory_plan import GB, ClusterConfig, make_plan
from nemo_tau2.models.model_shape import ModelShape, find_model_config, model_shape
from nemo_tau2.models.policy import PolicyConfig, TrainingSequence
from nemo_tau2.models.policy.lm_policy import Policy

SHAPES = {
    "0.6b": "Qwen/Qwen3-0.6B",
    "1.7b": "Qwen/Qwen3-1.7B",
    "4b": "Qwen/Qwen3-4B-Instruct-2507",
    "8b": "Qwen/Qwen3-8B",
}
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.0, "H200": 989.0}  # dense; first name found in the card's
LENGTHS = Path(__file__).parent / "data" / "tau2_test_episode_lengths.json"
# The recipes' loss (examples/configs/grpo_tau2_qwen3_4b.yaml) and sizes.
LOSS = ClippedPGLossFn(ClippedPGLossConfig(ratio_clip_max=0.28, use_importance_sampling_correction=True))
GPU = {"max_len": 32768, "budgets": (4096, 8192, 16384, 32768, 65536), "chunk": 1024, "gen": (1024, 128), "turn": 1024}
DRY_RUN = {"max_len": 128, "budgets": (128, 256), "chunk": 32, "gen": (16, 4), "turn": 32}
ERRORS = {"error", "timed_error", "generation_error", "megatron_error"}  # a shape with any of them failed
TINY_QWEN3 = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024,
              "max_position_embeddings": 4096, "tie_word_embeddings": True}  # fmt: skip


def episodes(budget: int, max_len: int, vocab: int, seed: int) -> list[TrainingSequence]:
    """Episodes of exactly ``budget`` tokens in all, lengths from the tau2 mix (longest ``max_len``): a prompt, then
    turns of 16 tokens, policy (mask 1) and tool (mask 0) in turn."""
    mix = json.loads(LENGTHS.read_text())["episodes"]
    scale = max_len / max(e["total_tokens"] for e in mix)
    draw, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    out, left = [], budget
    while left >= 2:
        episode = draw.choice(mix)
        n = min(max(4, round(episode["total_tokens"] * scale)), left, max_len)
        n -= 2 - (left - n) if 0 < left - n < 2 else 0  # never leave a 1-token remainder
        prompt = min(max(1, round(episode["prompt_tokens"] * scale)), n - 1)
        mask = [0] * prompt + [(t // 16 + 1) % 2 for t in range(n - prompt)]
        ids = torch.randint(10, vocab, (n,), generator=generator).tolist()
        out.append(TrainingSequence(ids, mask, [-1.0 * m for m in mask], advantage=1.0 if len(out) % 2 else -1.0))
        left -= n
    return out


def single_turns(budget: int, turn: int, vocab: int, seed: int) -> list[TrainingSequence]:
    """``budget`` tokens as sequences of ``turn`` tokens (the last one takes the remainder): a prompt, then one
    sampled turn of an eighth of it (mask 1), as PivotRL trains a pivot's turn."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [turn] * (budget // turn - 1) + [budget - turn * (budget // turn - 1)]
    out = []
    for n in lengths:
        ids = torch.randint(10, vocab, (n,), generator=generator).tolist()
        mask = [0] * (n - n // 8) + [1] * (n // 8)
        out.append(TrainingSequence(ids, mask, [-1.0 * m for m in mask], advantage=1.0 if len(out) % 2 else -1.0))
    return out


def forward_flops(matmul_params: int, layers: int, attention_width: int, lengths: list[int]) -> float:
    return 2.0 * matmul_params * sum(lengths) + 2.0 * layers * attention_width * sum(n * n for n in lengths)


def fitting_depth(cfg: PolicyConfig, shape: ModelShape, cluster: ClusterConfig) -> int:
    """The most layers (all of them if possible, at least 2) whose plan fits one device at ``cfg``'s budget."""
    for layers in range(shape.num_blocks, 1, -1):
        if make_plan(cfg, cluster, reference=True, shape=with_blocks(shape, layers)).fits:
            return layers
    return 2


def with_budget(cfg: PolicyConfig, tokens: int) -> PolicyConfig:
    packing = cfg.sequence_packing.model_copy(update={"train_mb_tokens": tokens})
    return cfg.model_copy(update={"sequence_packing": packing})


def ladder_step(policy: Policy, plan, sequences: list[TrainingSequence], meter: PeakMemory) -> dict:
    """One GRPO step on ``sequences`` with its peak memory against ``plan`` (a trainer rank's DevicePlan)."""
    budget = sum(len(s) for s in sequences)
    meter.start()
    try:
        score_s, train_s, _ = grpo_step(policy, sequences, LOSS)
    except torch.OutOfMemoryError:
        _free(meter.device)
        return {"tokens": budget, "fits": False, "estimated_bytes": plan.total_bytes}
    measured = PeakMeasurement.of(plan, shape=policy.cfg.model_name, tokens=budget, measured_bytes=meter.peak())
    return {"tokens": budget, "fits": True, "peak_bytes": measured.measured_bytes,
            "estimated_bytes": measured.estimated_bytes, "ratio": round(measured.ratio, 4),
            "step_s": round(score_s + train_s, 4), "measurement": measured}  # fmt: skip


def speed_figures(lengths: list[int], score_s: float, train_s: float, *, matmul: int, shape: ModelShape,
                  peak_tflops: float | None) -> dict:  # fmt: skip
    """Tokens/s and MFU of a step on sequences of ``lengths`` (see the module docstring), for either backend."""
    train_tflops = 3 * forward_flops(matmul, shape.num_blocks, shape.attention_width, lengths) / train_s / 1e12
    return {"timed_tokens": sum(lengths), "sequences": len(lengths), "step_s": round(score_s + train_s, 4),
            "train_s": round(train_s, 4), "train_tokens_per_s": round(sum(lengths) / train_s, 1),
            "step_tokens_per_s": round(sum(lengths) / (score_s + train_s), 1),
            "train_tflops": round(train_tflops, 3),
            "train_mfu": round(train_tflops / peak_tflops, 4) if peak_tflops else None}  # fmt: skip


def check_shape(key: str, name: str, config, device: torch.device, sizes: dict, args, peak_tflops, meter,
                budget: Budget) -> dict:  # fmt: skip
    """One shape: the ladder, the timed steps (each backend), generation (module docstring); its JSON record. Each
    unit starts only if ``budget`` allows it (``skipped`` names the others)."""
    budgets = [b for b in sizes["budgets"] if b <= args.max_tokens] or [args.max_tokens]
    cfg = kit_policy_config(name, max(budgets), device=device.type, chunk=sizes["chunk"], max_len=sizes["max_len"])
    sizes = sizes | {"max_len": cfg.max_total_sequence_length}
    cluster, timed_budget = ClusterConfig(), min(sizes["max_len"], max(budgets))
    full = model_shape(config, name, "hf_configs")
    layers = fitting_depth(with_budget(cfg, timed_budget), full, cluster)
    shape = with_blocks(full, layers)
    record: dict = {"shape": name, "layers": layers, "layers_full": full.num_blocks, "parameters": shape.parameters,
                    "activation_checkpointing": cfg.activation_checkpointing,
                    "reshard_after_forward": cfg.dtensor_cfg.reshards(cfg.num_workers)}  # fmt: skip
    if device.type == "cuda":
        record["device_memory_bytes"] = float(torch.cuda.get_device_properties(device).total_memory)
    skipped = [why for why in (budget.allows("torch", key),) if why]
    if skipped:  # nothing of this shape starts: its other units would not fit either
        return record | {"skipped": skipped}
    started = time.monotonic()
    # dynamo's compiled blocks and their count of recompiles start anew with each shape: otherwise the shapes before
    # use up its recompile limit (8) and a later shape's blocks run eager (2026-12-04: 1.7B after 0.6B, 8B after 4B)
    torch.compiler.reset()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(with_layers(config, layers), dtype=torch.float32)
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    figures = functools.partial(speed_figures, matmul=matmul, shape=shape, peak_tflops=peak_tflops)
    batches = {b: episodes(b, sizes["max_len"], shape.vocab_size, seed=b) for b in budgets}  # one per budget
    tokenizer = build_tiny_tokenizer()
    initial = tempfile.TemporaryDirectory(prefix="gpu_check_") if args.megatron else None  # its weights: trained next
    if initial is not None:  # in the compute dtype: what both backends compute with, half the bytes to write
        weights = {k: v.to(cfg.compute_dtype) for k, v in model.state_dict().items()}
        model.save_pretrained(initial.name, state_dict=weights)
        del weights
    fitting = [b for b in budgets if b <= timed_budget]  # without the torch path: the Megatron one's candidates
    if "torch" in args.backends:
        record |= torch_steps(cfg, model, tokenizer, batches, cluster, shape, figures, args.steps, meter)
        fitting = [row["tokens"] for row in record["ladder"] if row["fits"] and row["tokens"] <= timed_budget]
    if args.levers and fitting:  # the timed micro-batch, each lever off in turn (fresh models, same seed)
        turns = single_turns(max(fitting), sizes["turn"], shape.vocab_size, seed=1)
        record |= measure_levers(cfg, with_layers(config, layers), tokenizer, batches[max(fitting)], args.steps,
                                 LOSS, figures, functools.partial(_free, device), turns)  # fmt: skip
    del model
    budget.finished("torch", key, time.monotonic() - started)
    if initial is not None:
        with initial:
            why = budget.allows("megatron", key)
            if why:
                skipped.append(why)
            else:
                started = time.monotonic()
                tried = sorted(fitting or budgets[:1])
                candidates = [batches[b] for b in reversed(tried[-2:])]  # the torch path's timed size first
                record |= measure_megatron(cfg, initial.name, tokenizer, candidates, LOSS, args.steps, figures, meter,
                                           record)  # fmt: skip
                budget.finished("megatron", key, time.monotonic() - started)
    elif args.megatron_note:
        record["megatron_note"] = args.megatron_note
    if not args.no_generation:
        why = budget.allows("generation", key)
        if why:
            skipped.append(why)
        else:
            started = time.monotonic()
            try:
                record["generation_tokens_per_s"] = generation_speed(config, tokenizer, device, sizes["gen"])
            except Exception as e:  # the trainer's figures above still count
                record["generation_error"] = one_line(e)
            _free(device)
            budget.finished("generation", key, time.monotonic() - started)
    return record | ({"skipped": skipped} if skipped else {})


def torch_steps(cfg: PolicyConfig, model, tokenizer, batches: dict, cluster, shape, figures, steps: int,
                meter) -> dict:  # fmt: skip
    """The torch path (FSDP2 ``Policy``): the ladder over ``batches``, then ``steps`` timed steps at the timed
    micro-batch (the largest that fits up to the recipe's); ``model`` is trained in place."""
    name, timed_budget = cfg.model_name, cfg.max_total_sequence_length
    policy = Policy(cfg, model=model, tokenizer=tokenizer, init_reference_model=True)
    ladder, out, fitting = [], {}, []
    try:
        for budget, sequences in batches.items():
            plan = make_plan(with_budget(cfg, budget), cluster, reference=True, shape=shape).devices[0]
            ladder.append(ladder_step(policy, plan, sequences, meter))
            row = ladder[-1]
            _log(f"{name}: {budget} tokens: " + (f"peak {row['peak_bytes'] / GB:.2f} GB, plan "
                 f"{row['estimated_bytes'] / GB:.2f} GB (ratio {row['ratio']:.2f}), step {row['step_s']:.2f} s"
                 if row["fits"] else f"out of memory (plan {plan.total_bytes / GB:.1f} GB)"))  # fmt: skip
            if not row["fits"]:
                break
        fitting = [row["tokens"] for row in ladder if row["fits"]]
        if fitting:
            timed = max([b for b in fitting if b <= timed_budget] or fitting[:1])
            out["memory_ratio"] = next(row["ratio"] for row in ladder if row["tokens"] == timed)
            try:  # after an out-of-memory step the ladder's figures still count
                times = [grpo_step(policy, batches[timed], LOSS) for _ in range(steps)]
                score_s, train_s = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
                out |= figures([len(s) for s in batches[timed]], score_s, train_s)
            except Exception as e:
                out["timed_error"] = one_line(e)
    finally:
        policy.shutdown()
        del policy
        _free(meter.device)
    measurements = [row.pop("measurement").as_dict() for row in ladder if row["fits"]]
    return out | {"ladder": ladder, "largest_micro_batch_tokens": max(fitting, default=None),
                  "measurements": measurements}  # fmt: skip


def with_layers(config, layers: int):
    """``config`` with ``layers`` transformer blocks (per-layer lists dropped: the class rebuilds them)."""
    fields = config.to_dict() | {"num_hidden_layers": layers, "max_window_layers": layers}
    fields.pop("layer_types", None)
    return type(config)(**fields)


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _emit(line: str, out) -> None:
    """A whole JSON line to stdout and, as it is produced, to ``--out``."""
    print(line, flush=True)
    if out is not None:
        out.write(line + "\n")
        out.flush()


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _table(records: list[dict]) -> str:
    rows = [f"{'shape':30} {'layers':>7} {'tokens/s':>10} {'MFU':>6} {'mem ratio':>9} {'largest mb':>10} "
            f"{'gen tok/s (1/8/32)':>22} {HEADER}"]  # fmt: skip
    for r in records:
        mfu = f"{r['train_mfu']:.1%}" if r.get("train_mfu") is not None else "-"
        gen = "/".join(f"{v:.0f}" for v in r.get("generation_tokens_per_s", {}).values()) or "-"
        rows.append(f"{r['shape']:30} {r.get('layers', 0):>3}/{r.get('layers_full', 0):<3} "
                    f"{r.get('train_tokens_per_s', '-'):>10} {mfu:>6} {r.get('memory_ratio', '-'):>9} "
                    f"{r.get('largest_micro_batch_tokens') or '-':>10} {gen:>22} {megatron_columns(r)}" + (
                    f"  ERROR {r['error']}"
                    if "error" in r else ""))  # fmt: skip
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=None, help=f"comma-separated, of {','.join(SHAPES)} (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, a tiny Qwen3 shape: the same path, for CI")
    parser.add_argument("--steps", type=int, default=2, help="timed steps at the timed micro-batch (median)")
    parser.add_argument("--max-tokens", type=int, default=32768, help="largest micro-batch of the ladder")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="skip the units of work that would end later than this many seconds after the start "
                        "(0: no limit)")  # fmt: skip
    parser.add_argument("--no-generation", action="store_true", help="skip the hf engine's generation speed")
    parser.add_argument("--backends", default="torch,megatron", help="trainer backends to measure (torch,megatron)")
    parser.add_argument("--out", help="also append every JSON line to this file as it is produced")
    levers_help = "re-measure the timed micro-batch with each trainer speed lever off in turn (gpu_check_levers.py)"
    parser.add_argument("--levers", action="store_true", help=levers_help + ": one lever_<name> field each")
    parser.add_argument("--write-calibration", metavar="FILE", help="write the memory plan's calibration (JSON)")
    args = parser.parse_args(argv)
    names = args.shapes.split(",") if args.shapes else list(SHAPES)
    unknown = [n for n in names if n not in SHAPES]
    if args.dry_run and args.shapes:
        parser.exit(2, "error: --dry-run runs one tiny CPU shape: drop --shapes\n")
    if unknown:
        parser.exit(2, f"error: --shapes: unknown shape {unknown[0]!r}; choose from {','.join(SHAPES)}\n")
    args.backends = args.backends.split(",")
    if not args.backends or set(args.backends) - {"torch", "megatron"}:
        parser.exit(2, f"error: --backends: {','.join(args.backends)!r}: give torch, megatron or torch,megatron\n")
    if args.steps < 1 or args.max_tokens < 2 or args.budget_s < 0:
        parser.exit(2, "error: --steps must be >= 1, --max-tokens >= 2 and --budget-s >= 0 (0: no limit)\n")
    if not args.dry_run and not torch.cuda.is_available():
        parser.exit(2, "error: torch sees no CUDA device: run on the GPU machine, or pass --dry-run (CPU)\n")
    args.megatron_note = megatron_missing() if "megatron" in args.backends else None
    args.megatron = "megatron" in args.backends and args.megatron_note is None
    args.names = [] if args.dry_run else names
    args.budget_s = args.budget_s or None
    return args


def main(argv: list[str] | None = None) -> int:
    budget = Budget(None)  # the clock starts before the arguments are read: the imports count too
    args = parse_args(argv)
    budget.budget_s = args.budget_s
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    meter = PeakMemory(device)
    card = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (dry run)"
    peak_tflops = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in card), None)
    sizes = DRY_RUN if args.dry_run else GPU
    if args.dry_run:
        torch.manual_seed(0)
        shapes = [("tiny", "tiny-qwen3", AutoConfig.for_model(**TINY_QWEN3))]
    else:
        shapes = [(n, SHAPES[n], find_model_config(SHAPES[n])[0]) for n in args.names]
    out = open(args.out, "a") if args.out else None  # noqa: SIM115  (closed below)
    records = []
    for key, name, config in shapes:
        _log(f"{name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, on {card}")
        try:
            record = check_shape(key, name, config, device, sizes, args, peak_tflops, meter, budget)
        except Exception as e:  # a failed shape is reported as such and the others still run
            record = {"shape": name, "error": one_line(e)}
            _log(f"{name}: failed: {record['error']}")
            _free(device)
        records.append({"check": "gpu_check", "device": card} | record)
        _emit(json.dumps(records[-1]), out)
    measurements = [PeakMeasurement(**{k: v for k, v in m.items() if k not in ("estimated_bytes", "ratio")})
                    for r in records for m in r.get("measurements", [])]  # fmt: skip
    calibration = calibration_report(measurements)
    summary = {
        "check": "gpu_check_summary", "device": card, "peak_bf16_tflops": peak_tflops, "dry_run": args.dry_run,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": project_commit(Path(__file__).resolve().parents[1]), "budget_s": args.budget_s,
        "elapsed_s": round(budget.elapsed(), 1),
        "skipped": {r["shape"]: r["skipped"] for r in records if "skipped" in r},
        "torch": torch.__version__, "failed": [r["shape"] for r in records if ERRORS & set(r)],
        "shapes": {r["shape"]: {k: r.get(k) for k in ("layers", "layers_full", "train_tokens_per_s", "train_mfu",
                   "memory_ratio", "largest_micro_batch_tokens", "generation_tokens_per_s", "error", "timed_error",
                   "generation_error", *MEGATRON_SUMMARY)} for r in records},
        "memory_plan": {k: v for k, v in calibration.items() if k != "measurements"},
    }  # fmt: skip
    stamped = kit_commit(Path(__file__).resolve().parents[1])
    if stamped not in (None, summary["commit"]):  # the tree's git and the kit's stamp disagree: both recorded
        summary["kit_commit"] = stamped
    if args.write_calibration:
        Path(args.write_calibration).write_text(json.dumps(summary | {"memory_plan": calibration}, indent=2) + "\n")
    _log(_table(records))
    _emit(json.dumps(summary), out)
    if out is not None:
        out.close()
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
