"""``tau2 evaluate-trajs`` of tau2 v1.0.1 on results files, its NL-assertion judge pointed at the scripted judge.

Runs in v1.0.1's environment: ``python v1_rescore.py JUDGE_BASE_URL OUTPUT_DIR RESULTS_FILE...``. tau2's CLI has no
judge options, so its judge constants are set first (as ``v1_reference.py`` and nemo-tau2's worker set them); then
tau2's own CLI entry point runs with the arguments a user would type.
"""

import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import tau2.evaluator.evaluator_nl_assertions as nl_assertions  # noqa: E402
from tau2.cli import main  # noqa: E402

if __name__ == "__main__":
    judge_base_url, output_dir, *results_files = sys.argv[1:]
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS = "openai/scripted-judge"
    nl_assertions.DEFAULT_LLM_NL_ASSERTIONS_ARGS = {
        "temperature": 0.0,
        "api_base": judge_base_url,
        "api_key": "none",
        "num_retries": 0,
    }
    sys.argv = ["tau2", "evaluate-trajs", *results_files, "-o", output_dir]
    main()
