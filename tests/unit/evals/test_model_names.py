"""Results name the policy model as the user configured it, with the path it resolved to beside it."""

from types import SimpleNamespace

from omegaconf import OmegaConf

from nemo_tau2.evals.eval import policy_model_names


def _cfg(model_name: str | None, backend: str = "vllm", llamacpp_cfg=None):
    generation = SimpleNamespace(model_name=model_name, openai_cfg=None, backend=backend, llamacpp_cfg=llamacpp_cfg)
    return SimpleNamespace(policy=SimpleNamespace(generation=generation))


def test_a_local_model_is_named_by_its_name_and_its_cache_folder_is_kept_beside_it():
    raw = OmegaConf.create({"policy": {"generation": {"model_name": "${local_model:smollm2-135m-instruct}"}}})
    names = policy_model_names(_cfg("/root/.cache/nemo-tau2/smollm2-135m-instruct"), raw)
    assert names == {
        "policy_model": "smollm2-135m-instruct",
        "policy_model_resolved": "/root/.cache/nemo-tau2/smollm2-135m-instruct",
    }


def test_a_plain_name_and_nemo_rls_layout_are_kept_as_written():
    raw = OmegaConf.create({"policy": {"generation": {"model_name": "Qwen/Qwen3-4B"}}})
    assert policy_model_names(_cfg("Qwen/Qwen3-4B"), raw) == {"policy_model": "Qwen/Qwen3-4B"}
    nemo_rl = OmegaConf.create({"generation": {"model_name": "${local_model:smollm2-135m-instruct}"}})
    assert policy_model_names(_cfg("/cache/smollm2"), nemo_rl)["policy_model"] == "smollm2-135m-instruct"
    assert policy_model_names(_cfg(None, backend="fake"), OmegaConf.create({})) == {"policy_model": "fake"}
    # llama.cpp is named by its GGUF file (the shipped SmolLM2 when none is given), not by the backend
    assert policy_model_names(_cfg(None, backend="llamacpp"), OmegaConf.create({})) == {
        "policy_model": "SmolLM2-135M-Instruct.Q4_1.gguf"
    }
    own = SimpleNamespace(model_path="/models/qwen3-4b-q4.gguf")
    assert policy_model_names(_cfg(None, "llamacpp", own), OmegaConf.create({}))["policy_model"] == "qwen3-4b-q4.gguf"
