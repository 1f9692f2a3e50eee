"""Where the tests find vLLM: the interpreter of the environment scripts/build_vllm_env.sh builds."""

from nemo_tau2.generation.vllm_launcher import VLLM_PYTHON_ENV
from tests.env_python import environment_python


def vllm_python() -> str:
    """The configured vLLM interpreter, or skip (fail under NEMO_TAU2_REQUIRE_VLLM=1) when there is none."""
    return environment_python(
        VLLM_PYTHON_ENV, "NEMO_TAU2_REQUIRE_VLLM", "vLLM", "scripts/build_vllm_env.sh --device cpu"
    )
