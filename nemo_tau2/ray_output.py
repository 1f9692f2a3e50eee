"""Ray's own output in the driver goes to a file in the run's log folder, not to the run's console.

A Ray driver prints two streams of Ray's to its stdout and stderr: the output of the Ray workers it owns (the
trainer's ranks, the Gym node launchers; ``log_to_driver``), and the cluster's error messages, such as the one each
agent of a lost node publishes: "Raylet is terminated. Termination is unexpected ..." followed by the last 20 lines of
that raylet's log, about 40 lines landing between rows of the step table. :func:`ray_output_to` sends both to one
file (each line prefixed with where it came from, as Ray prefixes them) and leaves one line per cluster error on this
module's logger, naming the file.

Ray 2.x offers no setting for the error stream (``log_to_driver=False`` silences the workers only), so this swaps
the two printing hooks of ``ray._private.worker`` (the error listener looks up ``print_to_stdstream`` at each
message; the workers' output goes through the ``ray_print_logs`` handler registered at ``ray.init``) and puts
Ray's back on exit. ``tests/unit/gym/test_ray_placement.py`` checks it against the Ray this project locks.
"""

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RAY_LOG_FILE = "ray.log"
_WORKER_LOGS_HANDLER = "ray_print_logs"  # the name ray.init registers the workers' output printer under
_ERROR_SOURCE = "raylet"  # the pid Ray's error listener gives the cluster's error messages
_SHOWN_CHARS = 160
_REPEAT_S = 30.0  # the same message again within this is on the console once (in the file each time)


def _prefix(data: dict[str, Any]) -> str:
    source = data.get("actor_name") or data.get("task_name") or "pid"
    where = f"{source}={data.get('pid')}" if source == "pid" else f"{source} pid={data.get('pid')}"
    if data.get("pid") == _ERROR_SOURCE:
        where = _ERROR_SOURCE
    ip = data.get("ip")
    return f"({where}{f', ip={ip}' if ip else ''}) "


_routed_to: list[Path] = []  # the file of the outermost block in force: an inner block (the Gym servers' Ray, opened
# inside a training run's) leaves the run's routing as it is


@contextmanager
def ray_output_to(path: str | Path) -> Iterator[Path]:
    """Within the block, Ray's output in this driver goes to ``path`` (appended; module docstring), or to the file
    of an enclosing block. Call it with Ray initialised (the workers' printer exists from ``ray.init`` on)."""
    import ray._private.worker as ray_worker

    if _routed_to:
        yield _routed_to[0]
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sink = path.open("a", buffering=1, encoding="utf-8", errors="replace")
    lock = threading.Lock()
    announced: dict[str, float] = {}  # the console line of a message -> when it was last shown

    def to_file(data: dict[str, Any], ignore_prefix: bool = False) -> None:
        lines = [str(line) for line in data.get("lines") or []]
        prefix = _prefix(data)
        with lock:
            if sink.closed:  # a message Ray was printing as the block ended
                return
            for line in lines:
                sink.write(f"{prefix}{line}\n")
        if data.get("pid") == _ERROR_SOURCE and lines:
            first = " ".join(lines[0].split())
            shown = first if len(first) <= _SHOWN_CHARS else first[: _SHOWN_CHARS - 3] + "..."
            now = time.monotonic()
            if now - announced.get(shown, -_REPEAT_S) >= _REPEAT_S:  # each of a lost node's agents sends it
                announced[shown] = now
                logger.warning("Ray: %s (the whole message: %s)", shown, path)

    dispatcher = ray_worker.global_worker_stdstream_dispatcher
    original_printer = ray_worker.print_to_stdstream
    worker_logs = [handler for name, handler in dispatcher.handlers if name == _WORKER_LOGS_HANDLER]
    ray_worker.print_to_stdstream = to_file
    if worker_logs:
        dispatcher.remove_handler(_WORKER_LOGS_HANDLER)
        dispatcher.add_handler(_WORKER_LOGS_HANDLER, to_file)
    _routed_to.append(path)
    try:
        yield path
    finally:
        _routed_to.clear()
        ray_worker.print_to_stdstream = original_printer
        if worker_logs and any(name == _WORKER_LOGS_HANDLER for name, _ in dispatcher.handlers):
            dispatcher.remove_handler(_WORKER_LOGS_HANDLER)  # still connected: Ray's printer back
            dispatcher.add_handler(_WORKER_LOGS_HANDLER, worker_logs[0])
        with lock:
            sink.close()
