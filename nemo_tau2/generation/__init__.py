"""Policy generation endpoints: vllm, hf (transformers), llamacpp and openai backends behind one vLLM surface.

``start_generation(cfg)`` starts the backend named by ``policy.generation`` and returns a handle whose
``base_urls`` (each ending in ``/v1``) NeMo-Gym's ``vllm_model`` server can call; ``validate_gym_generation_config``
checks a config against the gym-rollout rules before anything starts. See README.md in this folder.
"""

from nemo_tau2.generation.config import GenerationConfig
from nemo_tau2.generation.errors import GenerationConfigError, GenerationStartupError
from nemo_tau2.generation.launch import GenerationHandle, start_generation
from nemo_tau2.generation.validation import validate_gym_generation_config

__all__ = [
    "GenerationConfig",
    "GenerationConfigError",
    "GenerationHandle",
    "GenerationStartupError",
    "start_generation",
    "validate_gym_generation_config",
]
