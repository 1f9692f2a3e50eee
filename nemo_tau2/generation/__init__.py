"""Policy generation endpoints: vllm, hf (transformers), llamacpp and openai backends behind one vLLM surface.

``start_generation(cfg)`` starts the backend named by ``policy.generation`` and returns a handle whose
``base_urls`` (each ending in ``/v1``) NeMo-Gym's ``vllm_model`` server can call; ``validate_gym_generation_config``
checks a config against the gym-rollout rules before anything starts. See README.md in this folder.

The launcher (``start_generation``, ``GenerationHandle``) is imported on first use: the trainer's config imports
``generation.config``, and a torch-only machine (the GPU kit, ``bench/gpu_check.py``) must not need the HTTP servers'
packages for that.
"""

from typing import Any

from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.generation.errors import GenerationConfigError, GenerationStartupError
from nemo_tau2.generation.validation import validate_gym_generation_config

_LAUNCH_NAMES = ("GenerationHandle", "start_generation")

__all__ = [
    "GenerationConfig",
    "GenerationConfigError",
    "GenerationHandle",
    "GenerationStartupError",
    "start_generation",
    "validate_gym_generation_config",
]


def __getattr__(name: str) -> Any:
    if name in _LAUNCH_NAMES:
        from nemo_tau2.generation import launch

        return getattr(launch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
