"""The tiny policy's warm start is built once per key and copied after: the copy is the same files a fresh build
writes (the build is deterministic), another key builds anew, and a half-written build is never used."""

import logging
from pathlib import Path

import pytest
import torch

from nemo_tau2.algorithms.tiny_policy import TinyPolicyConfig
from nemo_tau2.tau2_env.gym_rows import compact_rows
from nemo_tau2.testing import warm_start


def _rows() -> list[dict]:
    return compact_rows("mock", ["update_task_1", "create_task_1"])


def _files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "nemo-tau2" / "tiny-policies"


def test_a_second_build_is_copied_from_the_cache_and_equals_a_fresh_one(cache_home, tmp_path, monkeypatch, caplog):
    cfg, rows = TinyPolicyConfig(warm_start_steps=3), _rows()
    fresh = warm_start.build_tiny_policy(cfg, rows, tmp_path / "first")
    (cached,) = [path for path in cache_home.iterdir() if path.is_dir()]

    def no_training(*args):
        raise AssertionError("the cached warm start was trained again")

    monkeypatch.setattr(warm_start, "_warm_start", no_training)
    with caplog.at_level(logging.INFO, logger=warm_start.__name__):
        copy = warm_start.build_tiny_policy(cfg, rows, tmp_path / "second")
    assert "is cached" in caplog.text
    assert _files(copy) == _files(fresh) == _files(cached)
    assert "model.safetensors" in _files(copy) and "tokenizer.json" in _files(copy)

    monkeypatch.undo()  # a build in an empty cache writes the same bytes: what the cache hands out is what a build is
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "other_cache"))
    assert _files(warm_start.build_tiny_policy(cfg, rows, tmp_path / "rebuilt")) == _files(fresh)


def test_other_settings_or_rows_build_anew_and_a_partial_build_is_not_used(cache_home, tmp_path):
    rows = _rows()
    warm_start.build_tiny_policy(TinyPolicyConfig(warm_start_steps=2), rows, tmp_path / "a")
    warm_start.build_tiny_policy(TinyPolicyConfig(warm_start_steps=2, seed=1), rows, tmp_path / "b")
    warm_start.build_tiny_policy(TinyPolicyConfig(warm_start_steps=2), rows[:1], tmp_path / "c")
    built = sorted(path for path in cache_home.iterdir() if path.is_dir())
    assert len(built) == 3
    assert _files(tmp_path / "a")["model.safetensors"] != _files(tmp_path / "b")["model.safetensors"]

    # a build killed midway: its folder is named .partial, never by the key; the next build replaces it
    (first,) = [path for path in built if _files(path) == _files(tmp_path / "a")]
    partial = first.rename(cache_home / f"{first.name}.partial")
    (partial / "model.safetensors").write_bytes(b"torn")
    again = warm_start.build_tiny_policy(TinyPolicyConfig(warm_start_steps=2), rows, tmp_path / "a_again")
    assert _files(again) == _files(tmp_path / "a") and not partial.exists()


def test_the_batched_warm_start_loss_is_each_examples_own_as_if_unpadded():
    """The warm start batches its examples right-padded and without an attention mask (causal attention keeps the
    padding from every real token): each example's reply loss in the batch is the loss of that example alone."""
    cfg = TinyPolicyConfig()
    tokenizer = warm_start.build_tiny_tokenizer()
    config = warm_start.tiny_policy_architecture(cfg, tokenizer)
    examples = warm_start._warm_start_examples(cfg, _rows(), tokenizer)
    assert len({len(p) + len(r) for p, r, _ in examples}) > 1, "the check needs padding"
    torch.manual_seed(0)
    model = warm_start.LlamaForCausalLM(config).eval()
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        batched = warm_start._reply_nll(model, *warm_start._batch(examples, pad))
        alone = torch.cat([warm_start._reply_nll(model, *warm_start._batch([one], pad)) for one in examples])
    assert torch.allclose(batched, alone, rtol=0, atol=1e-5), (batched - alone).abs().max()
