"""Whether a process is gone, as the tests that count processes read it: no /proc entry, or a zombie (exited, not
yet reaped by its parent)."""

from pathlib import Path


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")
