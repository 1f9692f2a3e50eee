"""banking_knowledge's shell variants: tau2's sandbox, each command confined and bounded (runs in the worker).

tau2 v1.0.1 runs a shell command with ``srt`` (bubblewrap: no network, the knowledge base read-only unless the
variant allows writes, its own best-effort refusal of ``..``, ``~`` and absolute paths) through
``subprocess.run(timeout=30)``. What is fine for one evaluation run on a laptop is not for a server that trains for
days on a node holding credentials: the command sees the server's environment and every file of the machine (srt
denies reads of a short list only; a path written with ``printf`` passes tau2's text check); at the timeout only
``srt`` is killed, so the command itself lives on (a ``sleep 1000`` outlives its episode; a fork bomb takes the
machine); the output is captured whole (``yes`` fills memory for 30 s); and every environment exports the 698
documents into a sandbox folder of its own that nothing removes (four per episode).

:class:`BoundedSandbox` is tau2's ``SandboxManager`` with only the running of a command replaced, registered where
tau2's ``_create_sandbox`` looks it up: the same refusal of escape patterns (tau2's own check and message), the same
answer for what a real agent runs (exit code, output sanitised by tau2's code, its timeout message). The command runs
confined by :mod:`nemo_tau2_tau2_confinement` (an allowlist: its knowledge base and the system folders, an empty
environment, its own processes) and bounded (``tau2.shell``): the command's process group, and a pids cgroup with
everything it starts, killed at ``timeout_s``; at most ``max_processes`` tasks; at most ``max_output_bytes`` of output.
Sandboxes live under one folder per worker; those an episode's seed made are removed when it ends, any other when
the request that made it is answered, the folder when the worker exits (and those of dead workers when one starts).
"""

import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import nemo_tau2_tau2_confinement as confinement
import nemo_tau2_tau2_services as services

_settings: dict = {}
_transient: list = []  # sandboxes made by the request being answered, not adopted by an episode
_ROOT_PREFIX = "nemo_tau2_sandboxes_"
_PIDS_HIERARCHIES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


def connect_shell(timeout_s: float, max_processes: int | None, max_output_bytes: int) -> dict:
    """Check tau2's sandbox dependencies and the pids cgroup, and register :class:`BoundedSandbox` with tau2."""
    import tau2.knowledge.sandbox_manager as sandbox_manager

    try:
        sandbox_manager._check_sandbox_dependencies()
    except sandbox_manager.SandboxRuntimeError as e:
        missing = str(e).split("installed: ", 1)[-1].split(".", 1)[0]
        needs = f"tau2's shell sandbox needs {missing} on PATH"
        raise services.Refused(f"{needs}: scripts/setup.sh sandbox installs them") from e
    hierarchy = _pids_hierarchy() if max_processes is not None else None
    if max_processes is not None and hierarchy is None:
        raise services.Refused(
            "tau2.shell.max_processes needs a pids cgroup this process can create (/sys/fs/cgroup/pids, or a "
            "delegated cgroup v2 with the pids controller): run the servers as root, or set "
            "tau2.shell.max_processes=null to leave commands unbounded, as tau2 does"
        )
    try:
        plan = confinement.host_plan()
    except confinement.ConfinementError as e:
        needs = f"the shell's confinement cannot start: {e}"
        raise services.Refused(f"{needs}: scripts/setup.sh sandbox installs it") from e
    root = Path(tempfile.gettempdir()) / f"{_ROOT_PREFIX}{os.getpid()}"
    _remove_dead_workers_folders(root.parent)
    root.mkdir(exist_ok=True)
    _settings.update(
        timeout_s=timeout_s, max_processes=max_processes, max_output_bytes=max_output_bytes, root=root,
        hierarchy=hierarchy, plan=plan,
    )  # fmt: skip
    if not getattr(sandbox_manager.SandboxManager, "nemo_tau2_bounded", False):
        sandbox_manager.SandboxManager = _bounded(sandbox_manager.SandboxManager)
    return {"sandboxes": str(root), "pids_cgroup": str(hierarchy) if hierarchy else None}


def adopt() -> list:
    """The sandboxes the current request made, now the caller's (an episode's) to :func:`remove`."""
    adopted = list(_transient)
    _transient.clear()
    return adopted


def remove(sandboxes) -> None:
    for sandbox in sandboxes or ():
        shutil.rmtree(sandbox.sandbox_dir, ignore_errors=True)


def remove_transient() -> None:
    remove(adopt())


def close() -> None:
    if "root" in _settings:
        shutil.rmtree(_settings["root"], ignore_errors=True)


def _bounded(base: type) -> type:
    class BoundedSandbox(base):
        nemo_tau2_bounded = True

        def __init__(self, *args, **kwargs):
            kwargs["base_temp_dir"] = str(_settings["root"])
            super().__init__(*args, **kwargs)
            _transient.append(self)

        def _create_srt_settings(self) -> None:
            """No settings file: commands run under :mod:`nemo_tau2_tau2_confinement`, not ``srt``, and a file beside
            the knowledge base would be one more thing a command could read."""

        def export_documents(self, documents, file_format: str = "txt"):
            """Read-only sandboxes share one export of the corpus per worker (tau2 writes the 698 files into every
            environment's folder: ~0.3 s, four times an episode); a writable one gets its own, as in tau2."""
            if self.allow_writes:
                return super().export_documents(documents, file_format)
            shared = _settings["root"] / f"shared_{file_format}_{len(documents)}" / "knowledge_base"
            if not shared.is_dir():
                staging = _settings["root"] / f".staging_{os.getpid()}"
                shutil.rmtree(staging, ignore_errors=True)
                own_kb, self.kb_dir = self.kb_dir, staging / "knowledge_base"
                self.kb_dir.mkdir(parents=True)
                super().export_documents(documents, file_format)
                staging.rename(shared.parent)
                self.kb_dir = own_kb
            self.kb_dir.rmdir()
            self.kb_dir.symlink_to(shared, target_is_directory=True)
            suffix = file_format if file_format in ("md", "json") else "txt"
            ids = [doc.get("id", "unknown") for doc in documents]
            return {doc_id: self.kb_dir / f"{self._sanitize_filename(doc_id)}.{suffix}" for doc_id in ids}

        def run_command(self, command: str, timeout: int = 30):
            if self._has_escape_pattern(command) is not None:
                return super().run_command(command, timeout)  # tau2's refusal, word for word
            limit = _settings["timeout_s"]
            try:
                code, stdout, stderr, outcome = _run_bounded(
                    lambda status_fd: confinement.confined_argv(
                        _settings["plan"], command, self.kb_dir, self.allow_writes, status_fd
                    )
                )
            except OSError as e:
                services.record_fault(f"tau2's shell sandbox could not run a command ({type(e).__name__}: {e})")
                raise
            if outcome == "timeout":
                return 124, "", f"Command timed out after {limit:g} seconds"  # tau2's message, the bound ours
            if outcome == "output":
                limit_bytes = _settings["max_output_bytes"]
                return 1, "", f"Command stopped: its output passed {limit_bytes} bytes (tau2.shell.max_output_bytes)"
            try:
                stdout, stderr = _text(stdout), _text(stderr)
            except UnicodeDecodeError as e:
                return 1, "", f"Command failed: {e}"  # what tau2's text-mode run answers
            return code, self._sanitize_output(stdout, command), self._sanitize_output(stderr, command)

    BoundedSandbox.__qualname__ = BoundedSandbox.__name__
    return BoundedSandbox


def _text(raw: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes: UTF-8 here, universal newlines."""
    return raw.decode().replace("\r\n", "\n").replace("\r", "\n")


def _run_bounded(argv_for) -> tuple[int, bytes, bytes, str]:
    """Run ``argv_for(status_fd)`` (bwrap, reporting on ``status_fd`` how the command ended) in its own session
    and pids cgroup; kill all of it at the first bound it passes. Returns (exit code, stdout, stderr, outcome):
    outcome ``done``, ``timeout`` or ``output``. A sandbox that never started the command raises
    :class:`ConfinementFailed` (the host's fault, never the command's answer)."""
    status_read, status_write = os.pipe()
    try:
        code, stdout, stderr, outcome = _run_in_group(argv_for(status_write), status_write)
    finally:
        os.close(status_write)
        started = _read_status(status_read)
    if outcome == "done" and not started:
        reason = stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {code}"]
        raise ConfinementFailed(f"bubblewrap did not start the command: {reason[0]}")
    return code, stdout, stderr, outcome


def _read_status(fd: int) -> bool:
    """Whether bwrap reported the command's exit (its JSON ``exit-code`` line: written only for a command that ran;
    its ``child-pid`` line comes before the sandbox is built); closes ``fd``."""
    os.set_blocking(fd, False)
    try:
        return b'"exit-code"' in os.read(fd, 1 << 12)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


class ConfinementFailed(OSError):
    """bubblewrap could not build the command's sandbox (a host fault: recorded, never scored)."""


def _run_in_group(argv: list[str], status_fd: int) -> tuple[int, bytes, bytes, str]:
    group = _make_group()
    procs = str(group / "cgroup.procs") if group else None

    def enter_group() -> None:  # in the child, before exec: everything it starts stays counted and killable
        if procs:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

    process = subprocess.Popen(
        argv, cwd="/", env=confinement.launch_environment(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True, preexec_fn=enter_group, pass_fds=(status_fd,),
    )  # fmt: skip
    chunks = {process.stdout.fileno(): [], process.stderr.fileno(): []}
    open_fds, size, outcome = set(chunks), 0, "done"
    deadline = time.monotonic() + _settings["timeout_s"]
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome = "timeout"
                break
            ready, _, _ = select.select(list(open_fds), [], [], left)
            for fd in ready:
                data = os.read(fd, 1 << 16)
                if not data:
                    open_fds.discard(fd)
                chunks[fd].append(data)
                size += len(data)
            if size > _settings["max_output_bytes"]:
                outcome = "output"
                break
        if outcome == "done":
            try:
                process.wait(max(deadline - time.monotonic(), 0.001))
            except subprocess.TimeoutExpired:
                outcome = "timeout"
    finally:
        _kill_all(process, group)
        process.stdout.close()
        process.stderr.close()
    stdout, stderr = (b"".join(chunks[fd]) for fd in chunks)
    return process.returncode, stdout, stderr, outcome


def _kill_all(process: subprocess.Popen, group: Path | None) -> None:
    """SIGKILL the command's session and, with a cgroup, every task left in it (a ``setsid`` does not leave it)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    if group is not None:
        for _ in range(50):
            pids = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
    process.wait()
    if group is not None:
        with contextlib.suppress(OSError):
            group.rmdir()


def _make_group() -> Path | None:
    hierarchy = _settings.get("hierarchy")
    if hierarchy is None:
        return None
    group = hierarchy / f"nemo_tau2_shell_{os.getpid()}_{time.monotonic_ns()}"
    group.mkdir()
    (group / "pids.max").write_text(str(_settings["max_processes"]))
    return group


def _pids_hierarchy() -> Path | None:
    """The first pids cgroup hierarchy where this process can make (and remove) a group with a ``pids.max``."""
    for hierarchy in _PIDS_HIERARCHIES:
        probe = hierarchy / f"nemo_tau2_probe_{os.getpid()}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            if (probe / "pids.max").is_file():
                return hierarchy
        finally:
            probe.rmdir()
    return None


def _remove_dead_workers_folders(parent: Path) -> None:
    for folder in parent.glob(f"{_ROOT_PREFIX}*"):
        pid = folder.name.removeprefix(_ROOT_PREFIX)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)
