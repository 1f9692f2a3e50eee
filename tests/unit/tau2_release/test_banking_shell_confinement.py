"""A model-run shell command sees its knowledge base and nothing else, whatever way it writes its paths.

The workers run as a server holding credentials does (``planted``: keys in their environment, a secret in their home
and one in the machine's temporary folder). Each test runs what a hostile policy would (paths that tau2's text check
does not see: ``printf`` escapes, ``$'...'``, ``base64``, variables, interpreters building them from ``chr(47)``;
links; ``/proc``; another episode's folder; a process left running) and asserts that the answer holds no planted
value, not even encoded, and that the command ran (no refusal by tau2's text check hid the attempt)."""

import base64
import os
import re
import shutil
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest

from nemo_tau2.tau2_release.client import Tau2Worker, Tau2WorkerError
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.shell_workers import Planted, srt_reference_results
from tests.unit.tau2_release.test_parity_v1 import assert_same_as_tau2, start_references
from tests.unit.tau2_release.worker_episodes import play, summary

DOMAIN = "banking_knowledge"
#: What a command's ``/`` may hold: the system folders and the path down to its knowledge base.
VISIBLE_ROOT = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"}


_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{16,}")


def _octal(path: str) -> str:
    return "".join(f"\\{ord(char):03o}" for char in path)


def _hex(path: str) -> str:
    return "".join(f"\\x{ord(char):02x}" for char in path)


def _ways_to_write(path: str) -> list[str]:
    """``path`` as a command can spell it without tau2's text check seeing an absolute path."""
    encoded = base64.b64encode(path.encode()).decode()
    slash_free = path.lstrip("/").replace("/", "${s}")
    return [
        f"cat $(printf '{_octal(path)}')",
        f"cat $(printf '{_hex(path)}')",
        f"cat $'{_octal(path)}'",
        f"cat $(echo {encoded} | base64 -d)",
        f"s=$(printf '\\057'); cat ${{s}}{slash_free}",
        f'python3 -c "print(open(chr(47) + {path[1:]!r}).read())"',
        f'perl -e \'open(F, chr(47) . "{path[1:]}") or die "no: $!"; print <F>\'',
        f'awk \'BEGIN {{ f = sprintf("%c", 47) "{path[1:]}"; while ((getline line < f) > 0) print line; '
        f'if ((getline line < f) < 0) print "unreadable" }}\'',
    ]


def _shell(worker: Tau2Worker, episode: dict, command: str) -> str:
    arguments = {"command": command}
    return worker.request("call_tool", episode_id=episode["episode_id"], name="shell", arguments=arguments)["content"]


def _assert_nothing_leaked(answer: str, planted: Planted) -> None:
    assert "Command blocked" not in answer  # tau2's text check did not stop it: the sandbox did
    decoded = ""
    for run in _BASE64_RUN.findall(answer):  # each run of base64's alphabet, cut to whole quads
        for start in range(4):  # wherever the encoded text begins in it
            chunk = run[start:][: (len(run) - start) // 4 * 4]
            decoded += base64.b64decode(chunk).decode(errors="replace") + "\n"
    for value in planted.values:
        assert value not in answer and value not in decoded, f"{value} leaked: {answer[:300]}"


@pytest.fixture
def episode(writable):
    seeded = writable.request("seed", domain=DOMAIN, task_id="task_001")
    yield seeded
    writable.request("end", episode_id=seeded["episode_id"])


@pytest.mark.parametrize("command", ["env", "printenv", "printenv OPENAI_API_KEY WANDB_API_KEY", "export -p",
                                     "env | base64 -w0", "printenv WANDB_API_KEY | base64",
                                     "cat /proc/self/environ | tr '\\0' '\\n'"])  # fmt: skip
def test_a_command_sees_no_variable_of_the_server(writable, episode, planted, command):
    answer = _shell(writable, episode, command.replace("/proc", "$(printf '\\057')proc"))
    _assert_nothing_leaked(answer, planted)
    if command == "printenv":
        names = {line.split("=", 1)[0] for line in answer.splitlines()}
        assert names <= {"PATH", "HOME", "PWD", "SHLVL", "_", "OLDPWD", "LANG", "LANGUAGE"} | {
            name for name in names if name.startswith("LC_")
        }, answer


def test_no_spelling_of_a_path_reads_a_file_outside_the_knowledge_base(writable, episode, planted):
    for secret in (planted.home_file, planted.tmp_file):
        for command in _ways_to_write(str(secret)):
            answer = _shell(writable, episode, command)
            _assert_nothing_leaked(answer, planted)
            assert answer.startswith("Error (exit code") or "unreadable" in answer or answer == "(no output)", answer


def test_a_command_lists_only_the_system_folders_and_its_own_path(writable, read_only, episode, planted):
    listing = _shell(writable, episode, 'python3 -c "import os; print(sorted(os.listdir(chr(47))))"')
    assert set(eval(listing)) <= VISIBLE_ROOT, listing  # noqa: S307 - a Python list literal printed by Python
    project, home = Path.cwd(), planted.home_file.parent
    for folder in (project, home, Path("/root"), Path("/work")):
        answer = _shell(writable, episode, f"ls -a $(printf '{_octal(str(folder))}')")
        assert "No such file or directory" in answer, answer
    temporary = _shell(writable, episode, "ls -a $(printf '\\057tmp')")  # only the path down to the sandboxes
    visible = {".", "..", Path(writable.retrieval["shell"]["sandboxes"]).name}
    assert "No such file or directory" in temporary or set(temporary.split()) <= visible, temporary
    assert "No such file or directory" in _shell(writable, episode, "cat $(printf '\\056\\056')/srt-settings.json")
    for worker in (writable, read_only):  # the sandbox's own settings: none beside any knowledge base
        assert list(Path(worker.retrieval["shell"]["sandboxes"]).rglob("srt-settings.json")) == []


def test_links_out_of_the_knowledge_base_lead_nowhere(writable, episode, planted):
    target = _octal(str(planted.home_file))
    answer = _shell(writable, episode, f"ln -s $(printf '{target}') soft && cat soft")
    assert "No such file or directory" in answer, answer
    answer = _shell(writable, episode, f"ln $(printf '{target}') hard && cat hard")
    assert "No such file or directory" in answer, answer
    answer = _shell(writable, episode, "ln $(printf '\\057usr\\057bin\\057env') hard2 && ./hard2")
    assert "Invalid cross-device link" in answer or "Operation not permitted" in answer, answer
    _assert_nothing_leaked(answer, planted)
    assert planted.home_file.read_text().startswith("secret-in-home-")  # neither read nor touched


def test_proc_shows_the_command_its_own_processes_only(writable, episode, planted):
    pid = writable._process.pid
    worker_proc = _octal(f"/proc/{pid}")
    for command in (f"cat $(printf '{worker_proc}')/environ", f"ls -la $(printf '{worker_proc}')/cwd/",
                    "cat $(printf '\\057')proc/1/environ | tr '\\0' '\\n'",
                    "for f in $(printf '\\057')proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done"):  # fmt: skip
        _assert_nothing_leaked(_shell(writable, episode, command), planted)
    processes = _shell(writable, episode, "ls $(printf '\\057')proc | grep -c '^[0-9]'")
    assert int(processes) <= 6, processes  # bwrap's init, bash, ls, grep and their subshells
    cwd = _shell(writable, episode, f"ls $(printf '{worker_proc}')")
    assert pid <= 6 or "No such file or directory" in cwd, cwd


def test_an_episode_never_sees_another_episodes_folder(writable, planted):
    first, second = (writable.request("seed", domain=DOMAIN, task_id="task_002") for _ in range(2))
    token = f"written-by-first-{os.urandom(6).hex()}"
    assert _shell(writable, first, f"echo {token} > notes.md && cat notes.md") == f"{token}\n"
    for command in ("cat $(printf '\\056\\056/\\056\\056')/*/knowledge_base/notes.md",
                    "ls -R $(printf '\\056\\056/\\056\\056') | head -50",
                    "grep -r written-by-first $(printf '\\056\\056/\\056\\056') 2>&1 | head"):  # fmt: skip
        answer = _shell(writable, second, command)
        assert token not in answer, answer
        _assert_nothing_leaked(answer, planted)
    for episode in (first, second):
        writable.request("end", episode_id=episode["episode_id"])


def test_a_background_process_ends_with_its_answer(writable, episode, planted):
    """Two ways to outlive the answer (a subshell, ``nohup setsid``), each to write a file 6 s later: the answers
    come back at once, and neither file is ever written nor a process left on the host."""
    started = time.monotonic()
    answer = _shell(writable, episode, "(sleep 6.25; echo late > late.md) >&- 2>&- & echo started")
    assert answer == "started\n"
    answer = _shell(writable, episode, "nohup setsid sh -c 'sleep 6.25; echo late > late2.md' >&- 2>&- & echo ok")
    assert answer == "ok\n" and time.monotonic() - started < 6  # neither waited for its background process
    time.sleep(max(0.0, started + 7.5 - time.monotonic()))
    assert _shell(writable, episode, "ls late.md late2.md").startswith("Error (exit code 2)")
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout.splitlines()
    assert not [line for line in ps if "sleep 6.25" in line]  # nothing left on the host


#: What agents run in the knowledge base (tau2's tool description names ls, cat, grep, head, tail, find, wc, awk,
#: sed), pipes, a locale-dependent sort, a missing file, an interpreter, and (where allowed) writes. ``ls -la`` without
#: its ``total`` line: the blocks a folder's files take vary with the file system's state, on either side.
AGENT_COMMANDS = [
    "ls | head -20", "ls -la | tail -n +2 | head -8", "ls -l INDEX.md", "ls | wc -l", "ls -R | head -5",
    "cat INDEX.md | head -30", "head -n 20 INDEX.md", "tail -n 5 INDEX.md", "grep -ril 'overdraft' . | sort | head -5",
    "grep -rn 'wire transfer' --include='*.md' . | head -5", "grep -c 'fee' INDEX.md", "grep -l 'zzqx-none' *.md",
    "rg -l 'credit card' . | sort | head -5", "rg -n -i 'dispute' --max-count 1 . | sort | head -5",
    "find . -name '*card*' | sort | head -10", "find . -type f | wc -l", "wc -w INDEX.md", "wc -l *.md | tail -1",
    "awk 'NR>=3 && NR<=6' INDEX.md", "sed -n '1,5p' INDEX.md", "cut -c1-40 INDEX.md | head -5",
    "grep -oh '[A-Za-z]*fee[a-z]*' *.md | sort | uniq -c | sort -rn | head -5", "ls | head -3 | xargs wc -c",
    "file INDEX.md", "stat -c '%s %n' INDEX.md", "cat missing.md", "sort INDEX.md | head -5",
    "for f in $(ls | head -3); do head -1 $f; done", "python3 -c \"print(open('INDEX.md').read().count('doc_'))\"",
    "echo $((6 * 7)) && exit 3", "touch new.md && ls new.md", "mkdir -p drafts && echo a > drafts/a.md && ls drafts",
]  # fmt: skip


@pytest.mark.parametrize("variant", ["terminal_use", "terminal_use_write"])
def test_what_a_real_agent_runs_answers_as_in_tau2s_own_sandbox(variant, writable, read_only, judge, tmp_path):
    """One task's episodes with :data:`AGENT_COMMANDS` as its ``extra_reads``, against tau2 v1.0.1's own run of the
    variant (``srt``, the whole machine visible): every answer identical, writes included (refused alike where the
    variant is read-only)."""
    worker = writable if variant == "terminal_use_write" else read_only
    greeting = worker.request("greeting")
    task = next(task for task in worker.request("tasks", domain=DOMAIN, split="base")
                if "extra_reads" in episode_scripts(task, greeting))  # fmt: skip
    reads = [
        {"name": "shell", "arguments": {"command": command}, "requestor": "assistant"} for command in AGENT_COMMANDS
    ]
    start = partial(start_references, {DOMAIN: [task]}, judge.base_url, {"TMPDIR": str(tmp_path)}, tmp_path,
                    retrieval_variant=variant, reads=reads, scripts=["extra_reads"])  # fmt: skip
    references = start()
    played = play(worker, DOMAIN, task["id"], episode_scripts(task, greeting, reads)["extra_reads"])
    ours = {f"{DOMAIN}/{task['id']}/extra_reads": summary(played)}
    theirs = srt_reference_results(references, start)
    assert_same_as_tau2(_listing_times_masked(ours), _listing_times_masked(theirs))
    answers = [answer["content"] for answer in played["tool_answers"][: len(AGENT_COMMANDS)]]
    assert "./doc_" in answers[8] and "No such file or directory" in answers[25]
    assert ("Read-only file system" in answers[30]) == (variant == "terminal_use")


#: ``ls -l``'s time column ("Dec  2 16:40"): each side writes the documents into its sandbox when it makes it, so the
#: two runs' listings name the minute each was made, and differ when they straddle one (stop 61's run, at load ~4)
MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
LISTING_TIME = re.compile(rf"\b(?:{MONTHS}) [ \d]\d (?:\d\d:\d\d| \d{{4}}) ")


def _listing_times_masked(summaries: dict) -> dict:
    """The summaries with every listing's time column masked, nothing else changed."""
    masked = {}
    for key, episode in summaries.items():
        answers = [
            answer | {"content": LISTING_TIME.sub("<time> ", answer["content"])}
            if isinstance(answer.get("content"), str) else answer
            for answer in episode.get("tool_answers", [])
        ]  # fmt: skip
        masked[key] = episode | {"tool_answers": answers}
    return masked


def test_a_sandbox_that_cannot_be_built_is_the_hosts_fault_not_an_answer(writable):
    """bubblewrap reports the command's exit on a status pipe; without it (here: the episode's folder removed under
    it) the call fails as a service error, recorded as infrastructure, never shown to the agent as a tool answer."""
    root = Path(writable.retrieval["shell"]["sandboxes"])
    before = set(root.glob("agentic_search_*"))
    episode = writable.request("seed", domain=DOMAIN, task_id="task_003")
    (made,) = set(root.glob("agentic_search_*")) - before
    shutil.rmtree(made)
    with pytest.raises(Tau2WorkerError, match="bubblewrap did not start the command"):
        _shell(writable, episode, "ls")
    writable.request("end", episode_id=episode["episode_id"])
