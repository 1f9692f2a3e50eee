"""The prefix splice's cost per request: reading the recorded ids (checked against the vocabulary) and splicing them
onto the re-rendered prompt, at 2k / 8k / 32k prompt tokens; the last line is JSON.

This is what our vLLM entry point (and our other servers) add to a multi-turn request. The reference, measured in
the same run, is parsing the request's JSON body that carries those ids, which every server pays anyway (vLLM
parses it once more with pydantic). Target: <= 1 ms at 32k tokens.

    uv run python bench/splice_speed.py [--repeats 200]
"""

import argparse
import json
import random
import statistics
import time

from nemo_tau2.generation.vllm_extension.nemo_tau2_token_splice import recorded_prefix, splice_token_ids

VOCAB = 151_936  # Qwen3's
END_OF_TURN = 151_645
TURN_TOKENS = 400  # a tau2 turn: a tool result or a user message and the agent's answer


def conversation(prompt_tokens: int, seed: int = 0) -> tuple[list[dict], list[int]]:
    """A request's messages (the last assistant turn carrying its ids) and the full re-rendered prompt."""
    rng = random.Random(seed)
    ids = [rng.randrange(VOCAB - 1000) for _ in range(prompt_tokens)]
    for position in range(TURN_TOKENS, prompt_tokens, TURN_TOKENS):
        ids[position] = END_OF_TURN
    cut = prompt_tokens - 300  # the recorded prompt + generation end at the last turn's end-of-turn token
    while ids[cut - 1] != END_OF_TURN:
        cut -= 1
    recorded_prompt, generation = ids[: cut - 60], ids[cut - 60 : cut]
    messages = [
        {"role": "system", "content": "policy " * 500},
        {"role": "assistant", "content": "...", "prompt_token_ids": recorded_prompt,
         "generation_token_ids": generation},
        {"role": "user", "content": "next"},
    ]  # fmt: skip
    return messages, ids


def timed_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    rows = []
    for tokens in (2048, 8192, 32768):
        messages, rendered = conversation(tokens)
        body = json.dumps({"model": "m", "messages": messages}).encode()
        eot = frozenset({END_OF_TURN})

        def splice(messages=messages, rendered=rendered, eot=eot):
            prefix = recorded_prefix(messages, None, VOCAB)
            return splice_token_ids(prefix, rendered, eot)

        assert splice() == rendered  # the synthetic rendering equals the recorded ids: the splice gives it back
        splice_ms = timed_ms(splice, args.repeats)
        parse_ms = timed_ms(lambda body=body: json.loads(body), args.repeats)
        rows.append({"prompt_tokens": tokens, "splice_ms": splice_ms, "json_parse_ms": parse_ms,
                     "ratio_vs_json_parse": splice_ms / parse_ms})  # fmt: skip
        print(f"{tokens:>6} tokens: splice {splice_ms:.3f} ms, parsing the body {parse_ms:.3f} ms")
    at_32k = rows[-1]
    summary = {"benchmark": "splice_speed", "levels": rows, "splice_ms_at_32k": at_32k["splice_ms"],
               "target_ms_at_32k": 1.0, "ratio_vs_json_parse_at_32k": at_32k["ratio_vs_json_parse"]}  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
