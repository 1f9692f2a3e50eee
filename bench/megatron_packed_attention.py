"""What a packed row's attention costs in the Megatron backend: per-sequence (``packed_attention.SequenceAttention``)
against megatron-core's unfused ``DotProductAttention`` with the dense block-causal ``N x N`` mask the backend used
before (the reference, measured in the same run).

One row of ``--sequences`` sequences of ``--length`` tokens (``N`` = their product), Qwen3-like heads (``--heads``
query heads in ``--groups`` groups of ``--head-dim``), forward and backward of the core attention alone, on the CPU
in fp32 (or on CUDA with ``--device cuda``, in bf16). Each variant runs in a fresh subprocess: its peak memory is
the resident set's high-water mark above the one before it ran (CPU; ``VmHWM``) or the allocator's peak (CUDA),
and its time the median of ``--repeats`` forward+backward passes. The dense variant holds ``N^2`` mask entries and
``heads x N^2`` scores (twice over, softmax and its gradient): it grows with ``N^2``; the per-sequence one with
``sequences x length^2``. Last line: JSON with both and the ratios dense / per-sequence.

``--model-step``: instead, the Megatron backend's training step (``training.train_global_batch``, clipped PG loss)
on one packed row of that shape through a 4-layer Qwen3 of those heads (vocabulary 1024, fp32 on CPU): median
seconds of ``--repeats`` steps after one that gives the peak. Only the backend's public training API is used, so
the same command measures another checkout (``PYTHONPATH=/that/checkout``): before and after a change.

    python bench/megatron_packed_attention.py
    python bench/megatron_packed_attention.py --sequences 64 --length 64
    python bench/megatron_packed_attention.py --model-step
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _config(args: argparse.Namespace, dtype: torch.dtype):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=args.heads * args.head_dim, num_attention_heads=args.heads,
                             num_query_groups=args.groups, kv_channels=args.head_dim, attention_dropout=0.0,
                             params_dtype=dtype, bf16=dtype == torch.bfloat16, masked_softmax_fusion=False,
                             use_cpu_initialization=True)  # fmt: skip


def _block_causal_mask(lengths: list[int], device: torch.device) -> torch.Tensor:
    """The dense ``[1, 1, N, N]`` bool mask (True = masked) the backend built for a packed row before."""
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device))
    same = sequence[:, None] == sequence[None, :]
    return ~(same & torch.ones_like(same).tril())[None, None]


def run_variant(args: argparse.Namespace) -> dict:
    """One variant in this process: peak bytes and median seconds of forward + backward."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=0, world_size=1)
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from nemo_tau2.models.megatron.packed_attention import SDPA, SequenceAttention, packed_seq_params
    from nemo_tau2.models.megatron.parallel import initialize_megatron

    initialize_megatron(1, 1, seed=0)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = _config(args, dtype)
    lengths = [args.length] * args.sequences
    width = sum(lengths)
    generator = torch.Generator().manual_seed(0)

    def inputs() -> list[torch.Tensor]:
        shapes = [(width, 1, args.heads, args.head_dim)] + [(width, 1, args.groups, args.head_dim)] * 2
        return [torch.randn(s, generator=generator).to(device, dtype).requires_grad_() for s in shapes]

    if args.variant == "dense":
        module = DotProductAttention(config, 1, AttnMaskType.causal, "self").to(device)

        def step(q, k, v):
            return module(q, k, v, _block_causal_mask(lengths, device))
    else:
        module = SequenceAttention(config, 1, AttnMaskType.causal, "self").to(device)

        def step(q, k, v):
            return module(q, k, v, None, packed_seq_params=packed_seq_params(lengths, device, SDPA))

    tensors = [inputs() for _ in range(args.repeats + 1)]
    times = []
    for i, (q, k, v) in enumerate(tensors):
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")
            before = _status("VmRSS")
        started = time.perf_counter()
        step(q, k, v).float().square().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        if i == 0:  # the first pass: the peak (later ones may reuse what it freed)
            peak = (torch.cuda.max_memory_allocated() if device.type == "cuda" else _status("VmHWM")) - before
        else:
            times.append(elapsed)
        del q, k, v
    dist.destroy_process_group()
    return {"peak_bytes": peak, "seconds": statistics.median(times)}


def model_step(args: argparse.Namespace) -> dict:
    """The backend's training step on one packed row (``--model-step``; module docstring)."""
    import tempfile

    from transformers import AutoModelForCausalLM, Qwen3Config

    from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn
    from nemo_tau2.models.megatron.parallel import initialize_megatron
    from nemo_tau2.models.megatron.training import build_stack, train_global_batch
    from nemo_tau2.models.policy import PolicyConfig, TrainingSequence
    from nemo_tau2.models.policy.data import collate
    from nemo_tau2.models.policy.lm_policy import global_normalisers

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    width = args.sequences * args.length
    config = Qwen3Config(vocab_size=1024, hidden_size=args.heads * args.head_dim, intermediate_size=1024,
                         num_hidden_layers=4, num_attention_heads=args.heads, num_key_value_heads=args.groups,
                         head_dim=args.head_dim, max_position_embeddings=width, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    sequences = []
    for i in range(args.sequences):
        ids = torch.randint(1, 1024, (args.length,), generator=generator).tolist()
        mask = [0] * (args.length // 4) + [1] * (args.length - args.length // 4)
        sequences.append(TrainingSequence(ids, mask, [-1.0 * m for m in mask], advantage=1.0 if i % 2 else -1.0,
                                          prev_logprobs=[-1.0 * m for m in mask]))  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)
        cfg = PolicyConfig(model_name=folder, precision="float32", train_global_batch_size=args.sequences,
                           train_micro_batch_size=args.sequences, max_total_sequence_length=width,
                           sequence_packing={"enabled": True, "train_mb_tokens": width},
                           megatron_cfg={"enabled": True, "optimizer": {"lr": 1e-5}})  # fmt: skip
        initialize_megatron(1, 1, seed=0)
        stack = build_stack(cfg, folder)
    loss = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))
    batch = [collate(sequences, 0, packed=True)]
    times = []
    for i in range(args.repeats + 1):
        Path("/proc/self/clear_refs").write_text("5")
        before, started = _status("VmRSS"), time.perf_counter()
        train_global_batch(stack, batch, loss, *global_normalisers(sequences), 0)
        if i == 0:
            peak = _status("VmHWM") - before
        else:
            times.append(time.perf_counter() - started)
    dist.destroy_process_group()
    return {"bench": "megatron_packed_attention --model-step", "tokens": width, "sequences": args.sequences,
            "length": args.length, "peak_bytes": peak, "step_s": round(statistics.median(times), 4)}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: steadier on a shared machine)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model-step", action="store_true", help="time the backend's training step instead")
    parser.add_argument("--variant", choices=["dense", "per_sequence"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if min(args.sequences, args.length, args.heads, args.groups, args.head_dim, args.repeats, args.threads) < 1:
        parser.exit(2, "error: every size must be at least 1\n")
    if args.heads % args.groups:
        parser.exit(2, f"error: --groups {args.groups} must divide --heads {args.heads}\n")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: --device cuda: no CUDA device here; drop it to measure on the CPU\n")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model_step:
        print(json.dumps(model_step(args)))
        return 0
    if args.variant:
        print(json.dumps(run_variant(args)))
        return 0
    sizes = [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
             if k not in ("variant", "port", "model_step")]  # fmt: skip
    results = {}
    for variant in ("per_sequence", "dense"):
        command = [sys.executable, __file__, *sizes, f"--variant={variant}", f"--port={_free_port()}"]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        results[variant] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{variant}: peak {results[variant]['peak_bytes'] / 2**20:.1f} MiB, "
              f"{results[variant]['seconds'] * 1e3:.1f} ms", file=sys.stderr)  # fmt: skip
    dense, ours = results["dense"], results["per_sequence"]
    print(json.dumps({"bench": "megatron_packed_attention", "device": args.device,
                      "tokens": args.sequences * args.length, "sequences": args.sequences, "length": args.length,
                      "heads": args.heads, "groups": args.groups, "head_dim": args.head_dim,
                      "dense": dense, "per_sequence": ours,
                      "memory_ratio": round(dense["peak_bytes"] / max(ours["peak_bytes"], 1), 2),
                      "time_ratio": round(dense["seconds"] / ours["seconds"], 2)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
