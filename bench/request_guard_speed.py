"""What the request gate (:mod:`nemo_tau2.request_guard`: size, JSON depth, UTF-8, NaN, lone surrogates) costs per
request, against parsing the same body once with orjson (what the model server does anyway).

Bodies: a training-time policy request to the model server (the airline system prompt and tools, ``--turns``
turns of history, the last turn carrying ``--ids`` prompt token ids as NeMo-RL sends them), a ``/verify`` body of
the same episode, a small tool call, and the worst case the gate must refuse (an array 100,000 deep).

    uv run bench/request_guard_speed.py [--turns 40] [--ids 8000] [--repeat 200]

Prints a table, then a last line of JSON with the figures and the ratio gate / orjson.loads per body.
"""

import argparse
import json
import time

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)

# isort: split
import orjson

from nemo_tau2.request_guard import MAX_JSON_DEPTH, RequestBodyGuard
from nemo_tau2.tau2_env.gym_rows import task_row


def _bodies(turns: int, ids: int) -> dict[str, bytes]:
    row = task_row("airline", "0")["responses_create_params"]
    history = []
    for turn in range(turns):
        history.append({"type": "message", "role": "user", "content": f"My reservation is ABC{turn}. NaN? no."})
        history.append({"type": "function_call", "call_id": f"call_{turn}", "name": "get_reservation_details",
                        "arguments": json.dumps({"reservation_id": f"ABC{turn}"})})  # fmt: skip
        history.append({"type": "function_call_output", "call_id": f"call_{turn}", "output": '{"flights": []}' * 20})
    history[-2] |= {"prompt_token_ids": list(range(ids)), "generation_token_ids": list(range(40)),
                    "generation_log_probs": [-0.5] * 40}  # fmt: skip
    policy = orjson.dumps(row | {"input": row["input"] + history})
    verify = orjson.dumps({"responses_create_params": row, "response": {"output": history}, "termination_reason": "x"})
    return {
        "policy request": policy,
        "verify": verify,
        "tool call": orjson.dumps({"user_id": "mia_li_3668", "amount": 100}),
        "100,000 deep (refused)": b"[" * 100_000 + b"]" * 100_000,
    }


def _per_call_us(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--ids", type=int, default=8000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    guard = RequestBodyGuard(app=None)
    results = {}
    print(f"{'body':24s} {'bytes':>10s} {'gate us':>9s} {'orjson us':>10s} {'ratio':>6s}  verdict")
    for name, body in _bodies(args.turns, args.ids).items():
        verdict = guard._problem(body, "/v1/responses")
        gate = _per_call_us(lambda body=body: guard._problem(body, "/v1/responses"), args.repeat)
        try:
            orjson.loads(body)
            parse = _per_call_us(lambda body=body: orjson.loads(body), args.repeat)
        except orjson.JSONDecodeError:
            parse = float("nan")
        parsed = parse == parse  # NaN where orjson refuses the body
        results[name] = {"bytes": len(body), "gate_us": round(gate, 1),
                         "orjson_loads_us": round(parse, 1) if parsed else None,
                         "ratio": round(gate / parse, 3) if parsed else None,
                         "refused": verdict is not None}  # fmt: skip
        ratio = f"{gate / parse:6.2f}" if parse == parse else "     -"
        print(f"{name:24s} {len(body):>10d} {gate:>9.1f} {parse:>10.1f} {ratio}  {verdict or 'passes'}"[:160])
    print(json.dumps({"bench": "request_guard_speed", "max_json_depth": MAX_JSON_DEPTH, "bodies": results}))


if __name__ == "__main__":
    main()
