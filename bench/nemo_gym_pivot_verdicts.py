"""NeMo-Gym 0.7.0's pivot verdicts (``single_step_tool_use_with_argument_comparison``'s own comparator) on pairs of
expected and sampled actions, run in NeMo-Gym 0.7.0's environment by ``bench/pivots.py``.

Reads a JSONL file of ``{"expected": action, "actual": action}`` (NeMo-Gym's pivot action shapes) and prints one JSON
line: each pair's ``[reward, category]``, the comparator's CPU seconds over all pairs (``time.process_time``, the
comparator alone: no server, no HTTP) and the threshold used (the verifier's default config's).
"""

import json
import sys
import time
from pathlib import Path

import yaml
from pydantic import TypeAdapter
from resources_servers.single_step_tool_use_with_argument_comparison.common import verification_utils as verifier

CONFIG = (
    Path(verifier.__file__).resolve().parents[1] / "configs" / "single_step_tool_use_with_argument_comparison.yaml"
)


def threshold() -> float:
    config = yaml.safe_load(CONFIG.read_text())
    (block,) = next(server for name, server in config.items() if name.endswith("_resources_server"))[
        "resources_servers"
    ].values()
    return float(block["tool_call_comparator_config"]["word_count_similarity_threshold"])


def main(path: str) -> None:
    actions = TypeAdapter(verifier.ExpectedAction)
    pairs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    parsed = [(actions.validate_python(pair["expected"]), actions.validate_python(pair["actual"])) for pair in pairs]
    config = verifier.ToolCallComparatorConfig(word_count_similarity_threshold=threshold())
    comparator = verifier.ActionComparator(config=config)
    started = time.process_time()
    verdicts = [comparator.compare_action(expected, actual) for expected, actual in parsed]
    cpu_s = time.process_time() - started
    print(
        json.dumps(
            {
                "verdicts": [[v.reward, str(v.category)] for v in verdicts],
                "cpu_s": cpu_s,
                "word_count_similarity_threshold": config.word_count_similarity_threshold,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
