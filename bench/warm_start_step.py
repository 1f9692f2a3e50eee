"""The tiny policy's warm-start step as it runs (right padding, no attention mask) against the same step with the
padding mask it used before (reference), measured in the same run on the same batch: the GRPO smoke's settings and
rows (``grpo_tau2_cpu_smoke.yaml``'s ``tiny_policy``, mock update_task_1 and create_task_1).

    uv run bench/warm_start_step.py [--steps 30] [--repeats 3]

Prints each side's seconds per step (best of the repeats), then a last line of JSON with both and the ratio
(reference / ours).
"""

import argparse
import json
import time

import torch

from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.config import load_config, validate_config
from nemo_tau2.tau2_env.gym_rows import load_rows
from nemo_tau2.testing import warm_start

CONFIG = "examples/configs/grpo_tau2_cpu_smoke.yaml"


def _masked_nll(model, ids: torch.Tensor, predicted: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    """The loss the warm start computed before: the same, with the padding masked out."""
    targets, example_of = ids[:, 1:][predicted], predicted.nonzero()[:, 0]
    hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1][predicted]
    token_nll = -torch.log_softmax(model.lm_head(hidden).float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return torch.zeros(len(ids)).index_add(0, example_of, token_nll) / predicted.sum(-1)


def _seconds_per_step(loss_of, model, steps: int) -> float:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.zero_grad()
        loss_of(model).sum().backward()
        optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = validate_config(load_config(CONFIG), GRPOMasterConfig).tiny_policy
    rows = load_rows(domains_=["mock"], split="base", task_ids=["update_task_1", "create_task_1"], compact=True)
    tokenizer = warm_start.build_tiny_tokenizer()
    config = warm_start.tiny_policy_architecture(cfg, tokenizer)
    examples = warm_start._warm_start_examples(cfg, warm_start._task_rows(rows), tokenizer)
    ids, predicted = warm_start._batch(examples, tokenizer.pad_token_id)
    attention = torch.zeros_like(ids)
    for i, (prompt_ids, reply_ids, _) in enumerate(examples):
        attention[i, : len(prompt_ids) + len(reply_ids)] = 1
    sides = {
        "ours_no_mask": lambda model: warm_start._reply_nll(model, ids, predicted),
        "reference_masked": lambda model: _masked_nll(model, ids, predicted, attention),
    }
    best = {name: float("inf") for name in sides}
    for _ in range(args.repeats):
        for name, loss_of in sides.items():
            torch.manual_seed(cfg.seed)
            best[name] = min(best[name], _seconds_per_step(loss_of, warm_start.LlamaForCausalLM(config), args.steps))
    print(f"{len(examples)} examples, batch width {ids.shape[1]}, {torch.get_num_threads()} threads")
    for name, seconds in best.items():
        print(f"{name:18s} {seconds * 1000:8.1f} ms/step")
    result = {name: round(seconds, 4) for name, seconds in best.items()}
    result["ratio_reference_over_ours"] = round(best["reference_masked"] / best["ours_no_mask"], 3)
    print(json.dumps({"bench": "warm_start_step", "steps": args.steps, **result}))


if __name__ == "__main__":
    main()
