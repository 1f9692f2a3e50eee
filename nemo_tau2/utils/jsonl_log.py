"""Append-only JSON Lines files that a crash cannot corrupt; every results and metrics writer uses this one.

A record is one JSON object on one line, written with a single unbuffered ``write`` (so it reaches the OS at once)
and fsynced when the log is closed or :meth:`JsonlLog.sync` is called. A killed process, a full disk or a power
cut can therefore leave at most a *torn* line: the start of a record without its end. Appending to such a file
would glue the next record onto the torn one and lose both, so opening a log checks it first:

- a line that is not a whole JSON object (a torn tail, a line glued onto one by an older writer, NUL bytes after a
  power cut) is *set aside*: its bytes go to ``<name>.torn-<n>`` beside the file, the file keeps every whole line,
  and one warning line says how many bytes went where. The records those lines held are simply missing, so a
  resumable run redoes that work (an episode is rerun, a step is re-logged);
- a last record that is whole but lacks only its newline is kept and the newline added.

A write that fails part-way (``ENOSPC``) is cut back to the last whole line before the error is raised, so the
file never holds a torn line while the writer is alive.
"""

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

logger = logging.getLogger(__name__)

TORN_SUFFIX = ".torn"


@dataclass
class SetAside:
    """What opening a damaged log moved out of it."""

    side_file: Path
    num_lines: int
    num_bytes: int


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:
        return False


def _free_side_file(path: Path) -> Path:
    number = 1
    while (candidate := path.with_name(f"{path.name}{TORN_SUFFIX}-{number}")).exists():
        number += 1
    return candidate


def _write_durably(path: Path, chunks: list[bytes]) -> None:
    with path.open("wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def repair_jsonl(path: str | Path, consequence: str = "their records will be redone") -> SetAside | None:
    """Make ``path`` hold only whole JSON-object lines; set the others aside (see module docstring).

    Args:
        path: The log; absent is fine (nothing to repair).
        consequence: What the caller does about the lost records, for the warning line.

    Returns:
        What was set aside, or None when the file was whole.
    """
    path = Path(path)
    if not path.exists():
        return None
    bad: list[tuple[int, bytes]] = []  # (offset, raw line)
    last_line_unterminated = False
    offset = 0
    with path.open("rb") as f:
        for line in f:
            complete = line.endswith(b"\n")
            if line.strip() and not _is_record(line):
                bad.append((offset, line))
            elif not complete and line.strip():
                last_line_unterminated = True  # a whole record that only lacks its newline
            offset += len(line)
    if not bad:
        if last_line_unterminated:
            with path.open("ab") as f:
                f.write(b"\n")
                os.fsync(f.fileno())
        return None
    side_file = _free_side_file(path)
    _write_durably(side_file, [line if line.endswith(b"\n") else line + b"\n" for _, line in bad])
    tail_offset, tail = bad[-1]
    if len(bad) == 1 and tail_offset + len(tail) == offset:  # only the tail is damaged: cut it off in place
        with path.open("r+b") as f:
            f.truncate(tail_offset)
            os.fsync(f.fileno())
    else:  # damaged lines inside the file: rewrite it without them, then swap it in
        bad_offsets = {line_offset for line_offset, _ in bad}
        kept, position = [], 0
        with path.open("rb") as f:
            for line in f:
                if position not in bad_offsets:
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
                position += len(line)
        temporary = path.with_name(path.name + ".repair")
        _write_durably(temporary, kept)
        os.replace(temporary, path)
    report = SetAside(side_file, len(bad), sum(len(line) for _, line in bad))
    logger.warning(
        "%s: %d damaged line(s) (%d bytes, an interrupted write) set aside in %s; %s",
        path,
        report.num_lines,
        report.num_bytes,
        side_file.name,
        consequence,
    )
    return report


class JsonlLog:
    """An append-only JSONL file, repaired on open (see module docstring). Use as a context manager or ``close()``.

    Args:
        path: The file; its folder is created.
        consequence: What happens to records set aside on open (for the one warning line), e.g.
            ``"their episodes will be rerun"``.
    """

    def __init__(self, path: str | Path, consequence: str = "their records will be redone"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.set_aside = repair_jsonl(self.path, consequence)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, record: dict[str, Any]) -> None:
        """Write ``record`` as one whole line, now; on a failed write the file is cut back and the error raised."""
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        line = orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError:
            os.ftruncate(self._fd, start)
            raise

    def records(self) -> Iterator[dict[str, Any]]:
        """Every record in the file, oldest first."""
        with self.path.open("rb") as f:
            for line in f:
                if line.strip():
                    yield orjson.loads(line)

    def sync(self) -> None:
        """fsync: what was appended survives a power cut."""
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "JsonlLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_json_atomic(path: str | Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as indented JSON: a reader sees the old file or the new one, never half."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    _write_durably(temporary, [(json.dumps(value, indent=2) + "\n").encode()])
    os.replace(temporary, path)


def replace_lines(path: str | Path, lines: list[bytes]) -> None:
    """Replace ``path`` with ``lines`` (each ending in its newline): a reader sees the old file or the new one."""
    path = Path(path)
    temporary = path.with_name(path.name + ".tmp")
    _write_durably(temporary, lines)
    os.replace(temporary, path)
