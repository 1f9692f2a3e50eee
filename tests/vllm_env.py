"""Where the tests find vLLM: the interpreter of the environment ``scripts/setup.sh vllm`` builds (its CPU build)."""

from nemo_tau2.generation.vllm_launcher import VLLM_PYTHON_ENV
from tests.env_python import environment_python


def vllm_python() -> str:
    """``$NEMO_TAU2_VLLM_PYTHON``, else vLLM's CPU environment under ~/.cache/nemo-tau2 (built on first use)."""
    return environment_python(VLLM_PYTHON_ENV, "vllm", "vLLM")
