"""Policy training backend speed: get_logprobs, a train step, exporting weights to generation, Ray startup.

For one model shape (``tiny``: the 2-layer test Llama; ``smollm2-shape``: a randomly initialised Llama of
SmolLM2-135M's shape, same cost as the real weights) and a batch of ``--batch`` sequences of ``--seq-len`` tokens
(the second half generated):

- ``get_logprobs_s``: one no-grad pass over the batch; ``train_step_s``: one ``Policy.train`` (forward, backward,
  clip, AdamW step), median of ``--steps`` after a warm-up, and the tokens/s both give; ``sft_step_s`` /
  ``sft_train_tok_s``: the same step with SFT's NLL loss (``run_sft.py``), and its speed-up over GRPO's step;
- ``export_s``: ``state_dict_for_generation()``; ``clone_s``: what a copy of it would cost instead;
  ``update_weights_s``: ``GenerationHandle.update_weights`` into an in-process hf server of the same shape;
- with ``--ray-workers N``: ``ray_startup_s`` (``ray.init`` + N actors ready, model shipped) and their train step;
- with ``--packing``: trained tokens/s of packed vs padded micro-batches on the tau2 length mix (the token lengths of
  the test split's episodes, ``bench/data/tau2_test_episode_lengths.json``, rescaled so the longest is
  ``--seq-len``; ``--batch`` episodes drawn from it), padded ``--micro-batch`` sequences at a time, packed into
  ``--micro-batch x --seq-len`` tokens; target packed >= 1.5x padded;
- with ``--sharding``: trained tokens/s per rank of FSDP2 on 2 gloo ranks vs one unsharded process and vs 2
  unsharded replicas, the same global batch (the tau2 mix, padded); target sharded within 10% per rank.

Every process computes on one thread (Ray actors get one CPU each), so per-rank figures compare like with like.

    uv run python bench/policy_train_speed.py --model tiny
    uv run python bench/policy_train_speed.py --model smollm2-shape --batch 4 --seq-len 512 --ray-workers 2
    uv run python bench/policy_train_speed.py --model smollm2-shape --device cuda --precision bfloat16
    uv run python bench/policy_train_speed.py --model tiny --packing --sharding --batch 32 --seq-len 1024
"""

import argparse
import copy
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import nemo_tau2  # noqa: F401  (offline settings first)
from nemo_tau2.algorithms.loss import ClippedPGLossConfig, ClippedPGLossFn, NLLLossFn
from nemo_tau2.cluster import import_ray
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.tiny_model import SMOLLM2_135M_SHAPE, build_tiny_model
from nemo_tau2.models.policy import PolicyConfig, TrainingSequence
from nemo_tau2.models.policy.lm_policy import Policy

LOSS = ClippedPGLossFn(ClippedPGLossConfig(reference_policy_kl_penalty=0.0))
LENGTHS = Path(__file__).parent / "data" / "tau2_test_episode_lengths.json"
PACKING_TARGET = 1.5
SHARDING_TARGET = 0.9


def _model(name: str):
    tiny = build_tiny_model(seed=0)
    if name == "tiny":
        return tiny.model, tiny.tokenizer
    torch.manual_seed(0)
    config = LlamaConfig(**SMOLLM2_135M_SHAPE, pad_token_id=tiny.tokenizer.pad_token_id, bos_token_id=None,
                         eos_token_id=tiny.tokenizer.eos_token_id)  # fmt: skip
    return LlamaForCausalLM(config).eval(), tiny.tokenizer


def _batch(count: int, length: int, vocab: int) -> list[TrainingSequence]:
    generator = torch.Generator().manual_seed(0)
    prompt = length // 2
    sequences = []
    for i in range(count):
        ids = torch.randint(10, min(vocab, 500), (length,), generator=generator).tolist()
        mask = [0] * prompt + [1] * (length - prompt)
        sequences.append(TrainingSequence(ids, mask, [-1.0 * m for m in mask], advantage=1.0 if i % 2 else -1.0))
    return sequences


def _tau2_batch(count: int, longest: int, vocab: int) -> list[TrainingSequence]:
    """``count`` episodes with lengths drawn from the tau2 test-split mix (rescaled: the longest is ``longest``),
    each a prompt (the episode's first-turn share, mask 0) then generated and tool tokens alternating."""
    episodes = json.loads(LENGTHS.read_text())["episodes"]
    scale = longest / max(e["total_tokens"] for e in episodes)
    draw = random.Random(0)
    generator = torch.Generator().manual_seed(0)
    sequences = []
    for i in range(count):
        episode = draw.choice(episodes)
        length = max(4, round(episode["total_tokens"] * scale))
        prompt = max(1, round(episode["prompt_tokens"] * scale))
        mask = [0] * prompt + [(t // 16) % 2 for t in range(length - prompt)]  # turns of 16: policy, then tool
        ids = torch.randint(10, min(vocab, 500), (length,), generator=generator).tolist()
        sequences.append(TrainingSequence(ids, mask, [-1.0 * m for m in mask], advantage=1.0 if i % 2 else -1.0))
    return sequences


def _interleaved(policies: dict[str, Policy], sequences: list[TrainingSequence], steps: int) -> dict[str, float]:
    """Median step seconds of ``Policy.train`` per variant over the same ``sequences``, steps taken in turn (A, B,
    C, A, B, C, ...) so that every variant sees the same background load of a shared machine; one warm-up each."""
    batches = {}
    for name, policy in policies.items():
        batch = [copy.deepcopy(s) for s in sequences]
        for seq, lp in zip(batch, policy.get_logprobs(batch), strict=True):
            seq.prev_logprobs = lp
        policy.train(batch, LOSS)
        batches[name] = batch
    times: dict[str, list[float]] = {name: [] for name in policies}
    for _ in range(steps):
        for name, policy in policies.items():
            started = time.perf_counter()
            policy.train(batches[name], LOSS)
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def _compare(args, model, tokenizer, fields: dict, variants: dict[str, dict]) -> dict:
    """Build every variant (one process or Ray ranks), then time them in turn on the tau2 mix."""
    sequences = _tau2_batch(args.batch, args.seq_len, model.config.vocab_size)
    tokens = sum(len(s) for s in sequences)
    out: dict[str, object] = {"length_mix": str(LENGTHS.relative_to(LENGTHS.parents[1])), "mix_tokens": tokens}
    policies = {}
    try:
        for name, extra in variants.items():
            started = time.perf_counter()
            dtensor = fields["dtensor_cfg"] | extra.get("dtensor_cfg", {})
            cfg = PolicyConfig(**fields | extra | {"dtensor_cfg": dtensor})
            policies[name] = Policy(cfg, model=copy.deepcopy(model), tokenizer=tokenizer)
            out[f"{name}_startup_s"] = time.perf_counter() - started
            out[f"{name}_micro_batches_rank0"] = len(policies[name]._plan(sequences, training=True)[0])
        for name, step_s in _interleaved(policies, sequences, args.steps).items():
            ranks = variants[name].get("num_workers", 1)
            out[f"{name}_step_s"] = step_s
            out[f"{name}_tok_s_per_rank"] = tokens / step_s / ranks
            print(f"{name}: {out[f'{name}_tok_s_per_rank']:.0f} trained tokens/s per rank", flush=True)
    finally:
        for policy in policies.values():
            policy.shutdown()
    return out


def _packing_comparison(args, model, tokenizer, fields: dict) -> dict:
    budget = args.micro_batch * args.seq_len
    out = _compare(args, model, tokenizer, fields, {
        "padded": {},
        "packed": {"sequence_packing": {"enabled": True, "train_mb_tokens": budget}},
    })  # fmt: skip
    out["packed_over_padded"] = out["packed_tok_s_per_rank"] / out["padded_tok_s_per_rank"]
    out["packing_target"] = PACKING_TARGET
    return out


def _sharding_comparison(args, model, tokenizer, fields: dict) -> dict:
    ray = import_ray()
    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False)  # both 2-rank groups alive at once
    try:
        out = _compare(args, model, tokenizer, fields, {
            "unsharded_1": {},
            "replicas_2": {"num_workers": 2},
            "fsdp2_2": {"num_workers": 2, "dtensor_cfg": {"enabled": True}},
        })  # fmt: skip
    finally:
        ray.shutdown()
    out["fsdp2_over_unsharded_per_rank"] = out["fsdp2_2_tok_s_per_rank"] / out["unsharded_1_tok_s_per_rank"]
    out["fsdp2_over_replicas_per_rank"] = out["fsdp2_2_tok_s_per_rank"] / out["replicas_2_tok_s_per_rank"]
    out["sharding_target"] = SHARDING_TARGET
    return out


def _timed(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _train_timings(policy: Policy, sequences: list[TrainingSequence], steps: int) -> dict[str, float]:
    logprob_s, logprobs = _timed(lambda: policy.get_logprobs(sequences), 2)
    for seq, lp in zip(sequences, logprobs, strict=True):
        seq.prev_logprobs = lp
    policy.train(sequences, LOSS)  # warm-up
    train_s, _ = _timed(lambda: policy.train(sequences, LOSS), steps)
    # SFT's step (run_sft.py): the same trainer with the NLL loss; no logprob pass before it
    sft_s, _ = _timed(lambda: policy.train(sequences, NLLLossFn()), steps)
    tokens = sum(len(s) for s in sequences)
    return {
        "get_logprobs_s": logprob_s,
        "get_logprobs_tok_s": tokens / logprob_s,
        "train_step_s": train_s,
        "train_tok_s": tokens / train_s,
        "sft_step_s": sft_s,
        "sft_train_tok_s": tokens / sft_s,
        "sft_vs_grpo_train_step": train_s / sft_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "smollm2-shape"], default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--ray-workers", type=int, default=0, help="also time N Ray data-parallel workers")
    parser.add_argument("--torch-threads", type=int, default=None)
    parser.add_argument("--packing", action="store_true", help="packed vs padded on the tau2 length mix")
    parser.add_argument("--sharding", action="store_true", help="FSDP2 on 2 ranks vs unsharded, tokens/s per rank")
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    elif args.packing or args.sharding:
        torch.set_num_threads(1)  # as each Ray rank: per-rank figures compare like with like

    model, tokenizer = _model(args.model)
    fields = {
        "model_name": args.model,
        "train_global_batch_size": args.batch,
        "train_micro_batch_size": min(args.micro_batch, args.batch),
        "max_total_sequence_length": args.seq_len,
        "precision": args.precision,
        "dtensor_cfg": {"activation_checkpointing": args.activation_checkpointing},
        "device": args.device,
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-5}},
    }
    sequences = _batch(args.batch, args.seq_len, model.config.vocab_size)
    params = sum(p.numel() for p in model.parameters())
    result: dict[str, object] = {"model": args.model, "parameters": params, "batch": args.batch, **fields}

    if args.packing:
        result["packing"] = _packing_comparison(args, model, tokenizer, fields)
    if args.sharding:
        result["sharding"] = _sharding_comparison(args, model, tokenizer, fields)
    policy = Policy(PolicyConfig(**fields), model=copy.deepcopy(model), tokenizer=tokenizer)
    result |= _train_timings(policy, sequences, args.steps)
    result["export_s"], state = _timed(policy.state_dict_for_generation, 3)  # the stream, materialised
    result["clone_s"], _ = _timed(lambda: {k: v.clone() for k, v in state.items()}, 3)
    gen_cfg = GenerationConfig(backend="hf", model_name=args.model, temperature=1.0, top_p=1.0, hf_cfg={})
    with start_generation(gen_cfg, model=copy.deepcopy(model), tokenizer=tokenizer) as handle:
        result["update_weights_s"], _ = _timed(lambda: handle.update_weights(state), 3)
    policy.shutdown()
    print(f"in-process: {json.dumps({k: v for k, v in result.items() if k.endswith('_s')})}", flush=True)

    if args.ray_workers:
        started = time.perf_counter()
        ray_policy = Policy(PolicyConfig(**fields, num_workers=args.ray_workers), model=model, tokenizer=tokenizer)
        result["ray_workers"] = args.ray_workers
        result["ray_startup_s"] = time.perf_counter() - started
        ray_timings = _train_timings(ray_policy, _batch(args.batch, args.seq_len, model.config.vocab_size), args.steps)
        result |= {f"ray_{key}": value for key, value in ray_timings.items()}
        shutdown_started = time.perf_counter()
        ray_policy.shutdown()
        result["ray_shutdown_s"] = time.perf_counter() - shutdown_started
        print(
            f"ray: startup {result['ray_startup_s']:.1f} s, train step {result['ray_train_step_s']:.3f} s", flush=True
        )

    machine = {
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": os.getloadavg()[0],
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    print(json.dumps({"benchmark": "policy_train_speed", "machine": machine, "result": result}))


if __name__ == "__main__":
    main()
