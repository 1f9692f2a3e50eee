"""Resume loses nothing, whatever the file looks like: every results and metrics log cut at every byte offset of
its last record, lines glued by an older writer, and checkpoints left half-written."""

import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from nemo_tau2.algorithms.grpo import resumable_checkpoint
from nemo_tau2.config import apply_overrides, load_config
from nemo_tau2.evals.eval import pending_episodes, run_eval, setup_eval
from nemo_tau2.evals.results import ROLLOUTS_FILE, RolloutLog
from nemo_tau2.models.policy import PolicyConfig
from nemo_tau2.models.policy import checkpoint as ckpt
from nemo_tau2.utils.jsonl_log import JsonlLog
from nemo_tau2.utils.metrics_logger import METRICS_FILE, MetricsLogger


def _episode(task_id: str, sample: int = 0) -> dict:
    return {"domain": "airline", "task_id": task_id, "sample_index": sample, "status": "ok", "success": True,
            "reward": 1.0, "note": "ünïcödé ✓ \\n \" }{"}  # fmt: skip


RECORDS = [_episode(str(i)) for i in range(3)]
NEW = _episode("new")


def _as_lines(records: list[dict]) -> bytes:
    return b"".join(json.dumps(record, ensure_ascii=False).encode() + b"\n" for record in records)


def _open_append_close(kind: str, folder: Path) -> Path:
    """Open the log as its writer does on a rerun, append one record, close; the file's path."""
    if kind == "rollouts":
        log = RolloutLog(folder)
        log.append(NEW)
        log.close()
        return folder / ROLLOUTS_FILE
    cfg = SimpleNamespace(log_dir=str(folder), tensorboard_enabled=False, wandb_enabled=False)
    with MetricsLogger(cfg) as metrics:
        metrics.log(7, {"train/loss": 0.5})
    return folder / METRICS_FILE


@pytest.mark.parametrize("kind", ["rollouts", "metrics"])
def test_a_log_cut_at_every_byte_of_its_last_record_keeps_every_whole_record_and_sets_the_torn_tail_aside(
    tmp_path, kind
):
    whole = _as_lines(RECORDS)
    start_of_last = len(whole) - len(_as_lines(RECORDS[-1:]))
    for cut in range(start_of_last, len(whole) + 1):
        folder = tmp_path / f"cut_{cut}"
        folder.mkdir()
        name = ROLLOUTS_FILE if kind == "rollouts" else METRICS_FILE
        (folder / name).write_bytes(whole[:cut])

        path = _open_append_close(kind, folder)

        lines = path.read_bytes().split(b"\n")
        assert lines[-1] == b"", f"cut at {cut}: the file does not end with a whole line"
        records = [json.loads(line) for line in lines[:-1]]  # every line parses: nothing glued
        intact_last = cut >= len(whole) - 1  # all of the last record is there (its newline may be missing)
        assert records[:-1] == RECORDS[: 3 if intact_last else 2], f"cut at {cut}"
        assert records[-1] == (NEW if kind == "rollouts" else {"step": 7, "train/loss": 0.5})
        side_files = list(folder.glob(f"{name}.torn-*"))
        if intact_last or cut == start_of_last:
            assert side_files == [], f"cut at {cut}: nothing was torn"
        else:
            assert [p.name for p in side_files] == [f"{name}.torn-1"]
            assert side_files[0].read_bytes() == whole[start_of_last:cut] + b"\n"  # the torn bytes, kept


def test_a_torn_episode_is_rerun_and_reported_in_one_line(tmp_path, caplog):
    whole = _as_lines(RECORDS)
    (tmp_path / ROLLOUTS_FILE).write_bytes(whole[:-20])
    with caplog.at_level(logging.WARNING):
        log = RolloutLog(tmp_path)
    try:
        assert log.done() == {("airline", "0", 0), ("airline", "1", 0)}
        rows = [{"domain": "airline", "task_id": str(i)} for i in range(3)]
        assert pending_episodes(rows, 1, log.done()) == [{"domain": "airline", "task_id": "2", "sample_index": 0}]
    finally:
        log.close()
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "1 damaged line(s)" in warning and "rollouts.jsonl.torn-1" in warning and "rerun" in warning


def test_a_line_glued_onto_a_torn_one_by_an_older_writer_is_set_aside_and_both_episodes_rerun(tmp_path):
    glued = _as_lines(RECORDS[:1]) + _as_lines(RECORDS[1:2])[:-15] + _as_lines(RECORDS[2:]) + _as_lines([NEW])
    (tmp_path / ROLLOUTS_FILE).write_bytes(glued)
    log = RolloutLog(tmp_path)
    try:
        assert log.done() == {("airline", "0", 0), ("airline", "new", 0)}
        assert log.read() == [RECORDS[0], NEW]
    finally:
        log.close()
    (side,) = tmp_path.glob("rollouts.jsonl.torn-*")
    assert side.read_bytes() == _as_lines(RECORDS[1:2])[:-15] + _as_lines(RECORDS[2:])
    second = JsonlLog(tmp_path / ROLLOUTS_FILE)  # a repaired file opens clean: no second side file
    second.close()
    assert second.set_aside is None and len(list(tmp_path.glob("rollouts.jsonl.torn-*"))) == 1


def test_a_failed_write_is_cut_back_so_the_next_append_is_a_whole_line(tmp_path, monkeypatch):
    log = JsonlLog(tmp_path / "log.jsonl")
    log.append(RECORDS[0])
    real_write = os.write

    def disk_full(fd, data):
        real_write(fd, bytes(data[:10]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        log.append(RECORDS[1])
    monkeypatch.undo()
    log.append(RECORDS[2])
    log.close()
    assert list(JsonlLog(tmp_path / "log.jsonl").records()) == [RECORDS[0], RECORDS[2]]


def test_an_evaluation_resumed_over_a_torn_last_line_reruns_that_episode_and_loses_nothing(tmp_path, caplog):
    overrides = [f"eval.save_path={tmp_path}", "data.domains=[airline]", "data.num_tasks=2",
                 "eval.num_tests_per_prompt=1", "eval.k_values=[1]", "eval.bootstrap_samples=0"]  # fmt: skip
    raw = apply_overrides(load_config("examples/configs/evals/tau2_fake.yaml"), overrides)
    rollouts = tmp_path / ROLLOUTS_FILE
    torn = _as_lines([_episode("0")])[:-30]
    rollouts.write_bytes(torn)  # the previous run was killed while writing its first episode

    with caplog.at_level(logging.WARNING):
        summary, _ = run_eval(setup_eval(raw), raw)

    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert len(records) == 2 and len({r["task_id"] for r in records}) == 2
    assert all(r["status"] == "ok" and r["reward"] == 1.0 for r in records)
    assert summary["metrics"]["eval/overall/num_episodes"] == 2
    assert (tmp_path / "rollouts.jsonl.torn-1").read_bytes() == torn + b"\n"
    assert sum("set aside" in r.getMessage() for r in caplog.records) == 1


def _policy(num_workers: int = 1, megatron: bool = False, megatron_cfg_extra: dict | None = None) -> PolicyConfig:
    return PolicyConfig(model_name="tiny", train_global_batch_size=2, train_micro_batch_size=1,
                        max_total_sequence_length=64, num_workers=num_workers,
                        megatron_cfg={"enabled": megatron, **(megatron_cfg_extra or {})})  # fmt: skip


TORCH_POLICY = _policy()
V021 = {"tau2_version": "v0.2.1", "retrieval_variant": None}  # what a run of airline, retail or telecom plays


def _checkpoint(root: Path, step: int, trainer_state: bytes | None = None, without: str | None = None,
                megatron_layout: dict | None = None) -> Path:  # fmt: skip
    path = root / f"step_{step}"
    if megatron_layout is None:
        weights = {f"{ckpt.POLICY_DIR}/.metadata": b"tensors"}
    else:
        layout = f"{ckpt.MEGATRON_DIR}/{ckpt.MEGATRON_LAYOUT_FILE}"
        weights = {f"{ckpt.MEGATRON_DIR}/metadata.json": b"{}", layout: json.dumps(megatron_layout).encode()}
    for name, content in {**weights, ckpt.SCHEDULER_FILE: b"tensors", ckpt.RNG_FILE: b"tensors"}.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        if name != without:
            (path / name).write_bytes(content)
    state = json.dumps({"step": step, "curriculum": {"weights": [0.5, 0.25]}}, indent=2).encode()
    (path / ckpt.TRAINER_STATE_FILE).write_bytes(state if trainer_state is None else trainer_state)
    return path


def test_resume_never_picks_a_half_written_checkpoint_whatever_byte_its_trainer_state_ends_at(tmp_path):
    full_state = json.dumps({"step": 2, "curriculum": {"weights": [0.5, 0.25]}}, indent=2).encode()
    for cut in range(len(full_state) + 1):
        root = tmp_path / f"cut_{cut}"
        good = _checkpoint(root, 1)
        newest = _checkpoint(root, 2, trainer_state=full_state[:cut])
        _checkpoint(root, 3, without=ckpt.SCHEDULER_FILE)  # a part never written
        (root / "tmp_step_4").mkdir()  # a save still in progress
        found = resumable_checkpoint(root, TORCH_POLICY, played=V021)
        assert found == (newest if cut == len(full_state) else good), f"cut at {cut}"
    assert resumable_checkpoint(tmp_path / "absent", TORCH_POLICY, played=V021) is None


def test_resume_stops_in_one_line_on_a_checkpoint_of_the_other_backend_or_another_megatron_layout(tmp_path):
    megatron = _policy(num_workers=2, megatron=True)
    layout = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "data_parallel_size": 2,
              "make_vocab_size_divisible_by": 128}  # fmt: skip
    torch_root, megatron_root = tmp_path / "torch", tmp_path / "megatron"
    _checkpoint(torch_root, 1)
    newest = _checkpoint(megatron_root, 2, megatron_layout=layout)
    _checkpoint(megatron_root, 3, megatron_layout=layout, without=f"{ckpt.MEGATRON_DIR}/{ckpt.MEGATRON_LAYOUT_FILE}")
    torn = _checkpoint(megatron_root, 4, megatron_layout=layout)  # its layout.json cut short
    layout_file = torn / ckpt.MEGATRON_DIR / ckpt.MEGATRON_LAYOUT_FILE
    layout_file.write_bytes(layout_file.read_bytes()[:20])
    found = resumable_checkpoint(megatron_root, megatron, played=V021)
    assert found == newest  # step_3 and step_4 are incomplete: skipped
    with pytest.raises(ValueError, match=r"is not a complete checkpoint: layout.json is not a JSON object$"):
        ckpt.check_checkpoint_dir(torn, layout)
    expected = r"written by the torch backend \(policy/\), this run trains with the Megatron backend \(policy.megatron"
    with pytest.raises(ckpt.CheckpointMismatchError, match=expected) as torch_into_megatron:
        resumable_checkpoint(torch_root, megatron, played=V021)
    with pytest.raises(ckpt.CheckpointMismatchError, match="written by the Megatron backend") as megatron_into_torch:
        resumable_checkpoint(megatron_root, TORCH_POLICY, played=V021)
    # a layout.json without the optimizer's format (written before it was recorded) holds dp_reshardable shards
    with pytest.raises(ckpt.CheckpointMismatchError, match="data_parallel_size=2 .*, this run has .*parallel_size=1"):
        resumable_checkpoint(megatron_root, _policy(num_workers=1, megatron=True), played=V021)
    padded_otherwise = _policy(num_workers=2, megatron=True, megatron_cfg_extra={"make_vocab_size_divisible_by": 64})
    with pytest.raises(ckpt.CheckpointMismatchError, match="make_vocab_size_divisible_by=128 .*, this run has .*=64"):
        resumable_checkpoint(megatron_root, padded_otherwise, played=V021)  # its embedding has other rows
    assert "\n" not in str(torch_into_megatron.value) + str(megatron_into_torch.value)


def test_a_fully_reshardable_megatron_checkpoint_resumes_in_any_layout_a_dp_reshardable_one_only_in_its_own(tmp_path):
    """What ``layout.json`` records decides (``megatron_config.layout_refusal``); the loads themselves are
    ``tests/unit/models/megatron/test_training.py`` and ``test_policy.py``."""
    from nemo_tau2.models.policy.megatron_config import megatron_layout

    def run(num_workers: int, **megatron_cfg) -> PolicyConfig:
        return _policy(num_workers=num_workers, megatron=True, megatron_cfg_extra=megatron_cfg)

    dp2 = run(2)
    written = megatron_layout(dp2.megatron_cfg, 2)
    assert written["optimizer_format"] == "fully_reshardable" and written["use_distributed_optimizer"]
    newest = _checkpoint(tmp_path / "reshardable", 2, megatron_layout=written)
    for other in (run(1), run(2, tensor_model_parallel_size=2), run(4, pipeline_model_parallel_size=2),
                  run(2, make_vocab_size_divisible_by=64)):  # fmt: skip
        assert resumable_checkpoint(tmp_path / "reshardable", other, played=V021) == newest
    replicated = run(2, optimizer={"use_distributed_optimizer": False})
    with pytest.raises(ckpt.CheckpointMismatchError, match="use_distributed_optimizer=true, this run has false"):
        resumable_checkpoint(tmp_path / "reshardable", replicated, played=V021)
    own_shards = run(2, optimizer={"dist_ckpt_optim_fully_reshardable": False})
    _checkpoint(tmp_path / "own", 2, megatron_layout=megatron_layout(own_shards.megatron_cfg, 2))
    assert resumable_checkpoint(tmp_path / "own", own_shards, played=V021) is not None
    with pytest.raises(ckpt.CheckpointMismatchError, match=r"\(dp_reshardable\), this run has tensor_model") as e:
        resumable_checkpoint(tmp_path / "own", run(2, tensor_model_parallel_size=2), played=V021)
    assert "\n" not in str(e.value) and "dist_ckpt_optim_fully_reshardable=true" in str(e.value)
    model_space = megatron_layout(replicated.megatron_cfg, 2)
    _checkpoint(tmp_path / "replicated", 2, megatron_layout=model_space)
    assert model_space["optimizer_format"] == "model_space"
    assert (
        resumable_checkpoint(
            tmp_path / "replicated",
            run(2, tensor_model_parallel_size=2, optimizer={"use_distributed_optimizer": False}),
            played=V021,
        )
        is not None
    )
