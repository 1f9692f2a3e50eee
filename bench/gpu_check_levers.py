"""``bench/gpu_check.py --levers``: the trainer's speed levers, each toggled off on its own at the timed shape.

For one shape and its timed micro-batch (the largest that fits up to the recipe's), a fresh model with the same
seed is trained with every lever at its default ("all on"), then once per lever with that lever set to its old
value. Each run: the policy's logprobs of the batch, then ``steps`` timed GRPO steps. One JSON field per lever,
``lever_<name>``: tokens/s and MFU with and without it, their ratio, and the largest logprob and first-step loss
differences against the all-on run (equality within bf16 tolerance is part of the check, not only speed).

Levers (``models/policy``; the off value is what the trainer did before each lever):

- ``varlen_attention``: ``sequence_packing.attention`` varlen vs per_sequence;
- ``torch_compile``: ``dtensor_cfg.torch_compile`` true vs false;
- ``activation_checkpointing``: ``auto`` (chosen from the memory plan; the record names the mode) vs ``full``;
- ``reshard_after_forward``: the one-rank default (false) vs true.
"""

import statistics
from collections.abc import Callable

import torch
from gpu_check_run import grpo_step, one_line
from transformers import AutoModelForCausalLM

from nemo_tau2.models.policy import PolicyConfig, TrainingSequence
from nemo_tau2.models.policy.lm_policy import Policy

LEVERS_OFF = {
    "varlen_attention": {"sequence_packing": {"attention": "per_sequence"}},
    "torch_compile": {"dtensor_cfg": {"torch_compile": False}},
    "activation_checkpointing": {"dtensor_cfg": {"activation_checkpointing": "full"}},
    "reshard_after_forward": {"dtensor_cfg": {"reshard_after_forward": True}},
}
ALL_ON = {"dtensor_cfg": {"activation_checkpointing": "auto", "torch_compile": None, "reshard_after_forward": None},
          "sequence_packing": {"attention": "varlen"}}  # fmt: skip


def _with(cfg: PolicyConfig, *changes: dict) -> PolicyConfig:
    fields = cfg.model_dump()
    for change in changes:
        for block, values in change.items():
            fields[block] = fields[block] | values
    return PolicyConfig(**fields)


def _run(cfg: PolicyConfig, config, tokenizer, sequences: list[TrainingSequence], steps: int, loss,
         figures: Callable, free: Callable) -> dict:  # fmt: skip
    """A fresh model (seed 0) under ``cfg``: its logprobs of ``sequences``, then a first (compiling) step and
    ``steps`` timed ones."""
    torch.manual_seed(0)
    torch.compiler.reset()  # each fresh model compiled anew, not counted against the models before (gpu_check.py)
    with torch.device(cfg.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    policy = Policy(cfg, model=model, tokenizer=tokenizer, init_reference_model=True)
    try:
        logprobs = policy.get_logprobs(sequences)
        runs = [grpo_step(policy, sequences, loss) for _ in range(steps + 1)]
        result = figures([len(s) for s in sequences], statistics.median(r[0] for r in runs[1:]),
                         statistics.median(r[1] for r in runs[1:]))  # fmt: skip
        result["first_step_s"] = round(runs[0][0] + runs[0][1], 3)
        result["activation_checkpointing"] = getattr(policy._workers.worker, "activation_checkpointing", None)
        return {"result": result, "logprobs": logprobs, "loss": runs[0][2]["loss"]}
    finally:
        policy.shutdown()
        del policy, model
        free()


def measure_levers(cfg: PolicyConfig, config, tokenizer, sequences: list[TrainingSequence], steps: int, loss,
                   figures: Callable, free: Callable,
                   turns: list[TrainingSequence] | None = None) -> dict:  # fmt: skip
    """``{"levers_all_on": ..., "lever_<name>": ...}`` for ``cfg``'s shape (``config``) at ``sequences``; with
    ``turns`` (a micro-batch of the same tokens in many short sequences: PivotRL's single turns) also
    ``lever_varlen_attention_turns``, the one lever whose worth depends on how many sequences a micro-batch packs
    (2026-12-04, two 16k-token episodes: varlen 14-22% slower than per-sequence)."""
    try:
        base = _run(_with(cfg, ALL_ON), config, tokenizer, _fresh(sequences), steps, loss, figures, free)
    except Exception as e:  # noqa: BLE001  (the record says why)
        return {"levers_error": f"all levers on: {one_line(e)}"}
    out = {"levers_all_on": base["result"]}
    runs = [(name, change, sequences, base) for name, change in LEVERS_OFF.items()]
    if turns:
        try:
            turns_base = _run(_with(cfg, ALL_ON), config, tokenizer, _fresh(turns), steps, loss, figures, free)
            runs.append(("varlen_attention_turns", LEVERS_OFF["varlen_attention"], turns, turns_base))
        except Exception as e:  # noqa: BLE001
            out["lever_varlen_attention_turns"] = {"error": f"all levers on: {one_line(e)}"}
    for name, change, batch, on in runs:
        try:
            off = _run(_with(cfg, ALL_ON, change), config, tokenizer, _fresh(batch), steps, loss, figures, free)
        except Exception as e:  # noqa: BLE001
            out[f"lever_{name}"] = {"error": one_line(e)}
            continue
        out[f"lever_{name}"] = _compared(on, off) | ({"sequences": len(batch)} if batch is not sequences else {})
    return out


def _fresh(sequences: list[TrainingSequence]) -> list[TrainingSequence]:
    return [TrainingSequence(s.token_ids, s.token_mask, s.generation_logprobs, s.advantage) for s in sequences]


def _compared(on: dict, off: dict) -> dict:
    """One lever's field: tokens/s and MFU with and without it, their ratio, and how far the numbers moved."""
    on_speed, off_speed = on["result"]["train_tokens_per_s"], off["result"]["train_tokens_per_s"]
    diff = max(abs(a - b) for x, y in zip(on["logprobs"], off["logprobs"], strict=True)
               for a, b in zip(x, y, strict=True))  # fmt: skip
    return {
        "on_train_tokens_per_s": on_speed, "off_train_tokens_per_s": off_speed,
        "on_train_mfu": on["result"]["train_mfu"], "off_train_mfu": off["result"]["train_mfu"],
        "speedup": round(on_speed / off_speed, 3), "max_abs_logprob_diff": round(diff, 5),
        "first_loss_diff": abs(on["loss"] - off["loss"]), "off": off["result"],
    }  # fmt: skip
