"""How the tests stop a server of ours the way a cluster or a terminal does: SIGTERM while its requests are in flight,
then the time until the process has exited (the issue's bound is 5 s; the wait itself allows more, to measure)."""

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

STOP_BOUND_S = 5.0


def as_from_a_terminal() -> None:
    """``preexec_fn`` for a process a test will Ctrl-C: start it as from a terminal. A test runner started in the
    background by a script inherits SIGINT ignored (POSIX shells do that to background jobs), and so would its
    children, where Python then installs no KeyboardInterrupt handler: the test's Ctrl-C would be lost."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_in_flight(send: Callable[[], object], count: int) -> list[threading.Thread]:
    """``count`` daemon threads, each making one ``send()`` call; whatever it raises (the server going away) is
    ignored: the point is that the server has work in hand when the signal comes."""

    def one() -> None:
        with contextlib.suppress(Exception):
            send()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s"
        time.sleep(0.05)


def seconds_to_exit_after_sigterm(pid: int, exited: Callable[[], bool], timeout_s: float = 30.0) -> float:
    """SIGTERM ``pid``; the seconds until ``exited()`` is true (fails past ``timeout_s``)."""
    assert not exited(), "the server had exited before the signal"
    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    wait_for(exited, timeout_s, f"the server (pid {pid}) did not exit after SIGTERM")
    return time.monotonic() - started
