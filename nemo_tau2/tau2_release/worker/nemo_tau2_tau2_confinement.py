"""What a model-run shell command can see: its knowledge base and the system folders commands run from, nothing else.

tau2 v1.0.1's sandbox (``srt``) starts from ``--ro-bind / /`` and hides a short deny list (``~/.ssh``,
``/etc/passwd``, ...), and the command inherits the server's environment. A command that writes its path so that
tau2's text check does not see it (``cat $(printf '\\057...')``) then reads any file of the machine, and ``env``
prints the keys of the judge, the embedding endpoint and W&B into the transcript. For a server that trains for days
on a node holding credentials, the confinement has to be an allowlist, so the command runs under bubblewrap with a
root built from nothing:

- the system folders commands run from, read-only: ``/usr`` and the ``/bin``, ``/sbin`` and ``/lib*`` beside it
  (as the symlinks or folders they are on the host), and the few ``/etc`` files they read (:data:`ETC_FILES`);
- the episode's knowledge base, at its own path, in the folder that holds it (read-only; the knowledge base itself
  writable in the write variant); nothing of other episodes, the worker, the project, homes or ``/tmp``;
- a fresh ``/dev`` and a ``/proc`` of its own PID namespace, so the only processes it sees are its own;
- no network, no IPC or cgroup view of the host, no capabilities (``no_new_privs``), the root read-only;
- an environment of ``PATH``, ``HOME`` (the knowledge base) and the server's locale variables, nothing else; bwrap
  itself starts with that environment too, or its PID-1 process would show the server's in ``/proc/1/environ``.

What a real agent runs (``ls``, ``cat``, ``grep``, ``find``, ``wc``, ``head``, pipes) answers exactly as in tau2's
own sandbox: same shell (``bash -c``), same binaries, the same ``..`` (a real folder holding only the knowledge base),
writes refused as there (``Read-only file system``). Where answers differ, only a command that looks outside its
folder sees it: ``ls /`` lists the few mounted folders, ``env`` prints the three variables, absolute paths outside
the allowlist do not exist. ``srt`` is no longer in the loop (its checks are a subset of these, and it costs a
Node.js start, ~0.4 s, per command); tau2's own dependency check still runs when a sandbox is made.
"""

import os
import re
import shutil
from pathlib import Path

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_FOLDERS = ("usr",)
SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")  # symlinks into /usr on merged-/usr systems
# What the commands need from /etc: the alternatives behind awk, which, ...; the loader's cache; time zone, locale
# aliases and name-service order; file(1)'s and Python's type tables. No passwd, group, hosts or credentials.
ETC_FILES = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "locale.alias", "nsswitch.conf",
    "magic", "magic.mime", "mime.types",
)  # fmt: skip
_LOCALE_VARIABLES = re.compile(r"LANG|LANGUAGE|LC_[A-Z]+")
_LOCALE_VALUE = re.compile(r"C|POSIX|[A-Za-z]{1,8}(_[A-Za-z]{2})?(\.[A-Za-z0-9-]{1,20})?(@[A-Za-z]{1,20})?")


class ConfinementError(RuntimeError):
    """The host cannot give a command the confined view (no bubblewrap, no bash under the system folders)."""


def host_plan() -> dict:
    """Resolve once per worker what every command's sandbox binds: bwrap, the shell, the system folders."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise ConfinementError("bubblewrap (bwrap) is not on PATH")
    shell = shutil.which("bash", path=SYSTEM_PATH)
    if shell is None:
        raise ConfinementError(f"bash is not in the system folders ({SYSTEM_PATH})")
    mounts: list[str] = []
    for name in SYSTEM_FOLDERS:
        mounts += ["--ro-bind", f"/{name}", f"/{name}"]
    for name in SYSTEM_LINKS:
        path = Path("/") / name
        if path.is_symlink():
            mounts += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            mounts += ["--ro-bind", str(path), str(path)]
    for name in ETC_FILES:
        if (Path("/etc") / name).exists():
            mounts += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return {"bwrap": bwrap, "shell": shell, "system_mounts": mounts, "locale": locale_of(os.environ)}


def locale_of(environ) -> dict:
    """The server's locale variables whose values name a locale (``sort``/``grep`` answer as the server's would)."""
    return {
        name: value
        for name, value in environ.items()
        if _LOCALE_VARIABLES.fullmatch(name) and _LOCALE_VALUE.fullmatch(value)
    }


def confined_argv(plan: dict, command: str, kb_dir: Path, writable: bool, status_fd: int) -> list[str]:
    """bwrap's argv running ``command`` with ``bash -c`` in ``kb_dir`` (resolved: a read-only sandbox's is a link to
    the worker's one export), seeing only :func:`host_plan`'s system mounts and that folder; bwrap writes the
    command's exit code on ``status_fd`` when it ran (so a sandbox that failed is told from a command that failed)."""
    kb = kb_dir.resolve()
    argv = [
        plan["bwrap"], "--json-status-fd", str(status_fd), "--new-session", "--die-with-parent", "--cap-drop", "ALL",
        "--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--clearenv", "--setenv", "PATH", SYSTEM_PATH, "--setenv", "HOME", str(kb),
    ]  # fmt: skip
    for name, value in plan["locale"].items():
        argv += ["--setenv", name, value]
    argv += plan["system_mounts"]
    argv += ["--dev", "/dev", "--proc", "/proc", "--ro-bind", str(kb.parent), str(kb.parent)]
    if writable:
        argv += ["--bind", str(kb), str(kb)]
    argv += ["--chdir", str(kb), "--remount-ro", "/", "--", plan["shell"], "-c", command]
    return argv


def launch_environment() -> dict:
    """bwrap's own environment: its PID-1 process stays in the sandbox's ``/proc``, so it holds no server variable."""
    return {"PATH": SYSTEM_PATH}
