"""banking_knowledge's shell variants, every command confined (bubblewrap: its knowledge base and the system folders,
no network, writes only where the variant allows) and bounded by ``tau2.shell``: both variants score and answer as
tau2 v1.0.1's own run (``extra_reads`` reading through ``shell``); hostile commands each get tau2's refusal or a
bounded answer, never a crash, a file outside the episode's folder or a process left behind; two episodes of the
write variant see nothing of each other; an episode's sandbox goes with it, the worker's folder with the worker; a
missing dependency is refused at start in one line."""

import json
import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from nemo_tau2.tau2_release.client import Tau2Worker, Tau2WorkerError
from tests.unit.tau2_release.episode_scripts import episode_scripts
from tests.unit.tau2_release.shell_workers import SRT_START_FAILURE, TIMEOUT_S, shell_config, srt_reference_results
from tests.unit.tau2_release.test_parity_v1 import assert_same_as_tau2, start_references
from tests.unit.tau2_release.worker_episodes import play, play_every_script

DOMAIN = "banking_knowledge"
SHELL_READS = [
    {"name": "shell", "arguments": {"command": "grep -ril 'overdraft' . | sort | head -5"}, "requestor": "assistant"},
    {"name": "shell", "arguments": {"command": "head -n 12 INDEX.md && wc -l INDEX.md"}, "requestor": "assistant"},
]


def _shell(worker: Tau2Worker, episode: dict, command: str) -> str:
    arguments = {"command": command}
    return worker.request("call_tool", episode_id=episode["episode_id"], name="shell", arguments=arguments)["content"]


def _our_processes() -> list[str]:
    """Sandboxed commands still running (bubblewrap, srt, the tests' sleeps), and pids cgroups left behind."""
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout.splitlines()
    running = [line for line in ps if line.startswith(("bwrap", "sleep 1000", "yes")) or "/bin/srt" in line]
    # a group is named after the worker that made it (nemo_tau2_shell_<pid>_...): one of a worker killed long ago (a
    # stopped run) is not this test's leftover
    groups = [
        path.name
        for path in Path("/sys/fs/cgroup/pids").glob("nemo_tau2_shell_*")
        if Path("/proc", path.name.split("_")[3]).exists()
    ]
    return running + groups


@pytest.mark.parametrize("variant", ["terminal_use", "terminal_use_write"])
def test_shell_variants_score_and_answer_as_tau2(variant, writable, read_only, judge, tmp_path):
    """Every twelfth task (32nd for the writable variant), its oracle and perturbations, ``extra_reads`` searching
    with ``shell``: identical rewards, breakdowns and tool answers to tau2 v1.0.1's own run of the variant (its
    sandbox unbounded, as tau2 has it)."""
    worker = writable if variant == "terminal_use_write" else read_only
    assert worker.retrieval["variant"] == variant and worker.retrieval["shell"]["pids_cgroup"]
    greeting = worker.request("greeting")
    every = worker.request("tasks", domain=DOMAIN, split="base")
    stride = 12 if variant == "terminal_use" else 32  # each writable sandbox exports the corpus anew, on both sides
    tasks = [task for index, task in enumerate(every) if index % stride == 0]
    # tau2's own sandboxes are never removed: in the test's folder, not the machine's /tmp
    start = partial(start_references, {DOMAIN: tasks}, judge.base_url, {"TMPDIR": str(tmp_path)}, tmp_path,
                    retrieval_variant=variant, reads=SHELL_READS)  # fmt: skip
    references = start()
    ours = play_every_script(worker, DOMAIN, tasks, greeting, SHELL_READS)
    assert_same_as_tau2(ours, srt_reference_results(references, start))
    assert all(ours[key]["reward"] == 1.0 for key in ours if key.endswith("/oracle"))
    found = [ours[key]["tool_answers"][0]["content"] for key in ours if key.endswith("/extra_reads")]
    assert found and all("./doc_" in answer for answer in found)  # the files grep found, sorted


def test_a_reference_run_whose_sandbox_failed_to_start_is_run_again_and_a_lasting_failure_is_named():
    """srt's own start-up failure in tau2's reference run (its bridges not listening in time, on a loaded box) is no
    answer to compare: that run is run again; a run that meets it every time fails naming srt, never passes."""

    def reference(content: str) -> subprocess.Popen:  # a reference process's answer on its stdout, as v1_reference's
        scored = {"bk/task_001/extra_reads": {"reward": 1.0, "tool_answers": [{"content": content, "error": False}]}}
        return subprocess.Popen([sys.executable, "-c", "import sys; print(sys.argv[1])", json.dumps(scored)],
                                stdout=subprocess.PIPE, text=True)  # fmt: skip

    failed = f"Error (exit code 1): Error: {SRT_START_FAILURE} after 5 attempts\n"
    starts = []
    rerun = lambda content: lambda: starts.append(content) or [reference(content)]  # noqa: E731
    theirs = srt_reference_results([reference(failed)], rerun("699\n"))
    assert theirs["bk/task_001/extra_reads"]["tool_answers"][0]["content"] == "699\n" and starts == ["699\n"]
    assert srt_reference_results([reference("699\n")], rerun("unused")) and starts == ["699\n"]  # once is enough
    with pytest.raises(AssertionError, match=r"srt\) failed to start a command in each of 3 runs: \['bk/task_001"):
        srt_reference_results([reference(failed)], rerun(failed))


def test_hostile_commands_get_tau2s_refusal_or_a_bound_and_leave_nothing_behind(writable, judge):
    episode = writable.request("seed", domain=DOMAIN, task_id="task_001")
    blocked = "Error (exit code 1): Error: Command blocked - contains '{}' which could escape the sandbox"
    assert _shell(writable, episode, "cat /etc/passwd") == blocked.format("absolute path: /etc/passwd")
    assert _shell(writable, episode, "echo x > ../escaped.md") == blocked.format("..")
    assert _shell(writable, episode, "cat ~/.bashrc") == blocked.format("~")
    assert _shell(writable, episode, "ls $HOME") == blocked.format("$HOME")

    before = judge.requests
    fetch = f"python3 -c \"import urllib.request; urllib.request.urlopen('{judge.base_url}', timeout=2)\""
    assert "Error (exit code 1)" in _shell(writable, episode, fetch) and judge.requests == before  # no network

    started = time.monotonic()
    timed_out = f"Error (exit code 124): Command timed out after {TIMEOUT_S} seconds"
    assert _shell(writable, episode, "sleep 1000") == timed_out
    assert time.monotonic() - started < TIMEOUT_S + 3

    bomb = _shell(writable, episode, ":(){ :|:& };: ; sleep 2; echo survived")  # bounded at 64 tasks, then killed
    assert "survived" in bomb or "timed out" in bomb or "Resource temporarily unavailable" in bomb

    loud = _shell(writable, episode, "yes")
    assert loud == (
        "Error (exit code 1): Command stopped: its output passed 2000000 bytes (tau2.shell.max_output_bytes)"
    )
    assert _shell(writable, episode, "yes | head -c 300000 | wc -c") == "300000\n"  # within the bound: as tau2
    assert _shell(writable, episode, "cat") == "(no output)"  # stdin is not the worker's protocol pipe

    time.sleep(0.5)
    assert _our_processes() == []
    writable.request("end", episode_id=episode["episode_id"])


def test_writes_stay_in_their_episode_and_go_with_it(writable, read_only):
    first, second = (writable.request("seed", domain=DOMAIN, task_id="task_002") for _ in range(2))
    assert _shell(writable, first, "echo mine > notes.md && cat notes.md") == "mine\n"
    assert "No such file" in _shell(writable, second, "cat notes.md")
    root = Path(writable.retrieval["shell"]["sandboxes"])
    written = list(root.glob("*/knowledge_base/notes.md"))
    assert len(written) == 1  # in the first episode's folder, nowhere else
    writable.request("end", episode_id=first["episode_id"])
    assert not written[0].exists() and list(root.glob("*/knowledge_base/notes.md")) == []
    writable.request("end", episode_id=second["episode_id"])

    episode = read_only.request("seed", domain=DOMAIN, task_id="task_002")
    assert "Read-only file system" in _shell(read_only, episode, "echo x > notes.md")
    shared = Path(read_only.retrieval["shell"]["sandboxes"])
    assert list(shared.rglob("notes.md")) == []
    read_only.request("end", episode_id=episode["episode_id"])
    assert [path.name for path in shared.iterdir()] == ["shared_md_698"]  # the one export every sandbox reads


def test_the_worker_takes_its_sandboxes_with_it_and_a_missing_dependency_is_refused(judge, tmp_path, monkeypatch):
    with Tau2Worker(shell_config(judge, "terminal_use")) as worker:
        root = Path(worker.retrieval["shell"]["sandboxes"])
        worker.request("seed", domain=DOMAIN, task_id="task_001")  # never ended
        assert root.is_dir()
    assert not root.exists()

    config = shell_config(judge, "terminal_use")
    for tool in ("rg", "bwrap", "socat"):  # everything the sandbox needs but srt
        os.symlink(shutil.which(tool), tmp_path / tool)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Tau2WorkerError) as refused:
        Tau2Worker(config)
    needs = "tau2.shell: tau2's shell sandbox needs srt on PATH"
    assert str(refused.value) == f"{needs}: scripts/setup.sh sandbox installs them"


def test_a_verdict_counts_the_documents_a_shell_command_showed_not_the_names_it_listed(read_only):
    """``shell`` shows a document when its text comes back: a ``cat`` of its file, or a grep line ``<file>:<text>``;
    a listing (``ls``) or grep's counts (``<file>:<n>``) show none."""
    greeting = read_only.request("greeting")
    task = next(
        task
        for task in read_only.request("tasks", domain=DOMAIN, split="base")
        if len(task.get("required_documents") or []) >= 2
        and all(doc.replace("_", "").replace("-", "").isalnum() for doc in task["required_documents"][:2])
        and "extra_reads" in episode_scripts(task, greeting)
    )
    first, second = task["required_documents"][:2]
    commands = [
        f"cat {first}.md",
        "ls | head -3",
        f"grep -c 'the' {first}.md {second}.md",
        "grep -rn 'overdraft' . | head -4",
    ]
    reads = [{"name": "shell", "arguments": {"command": command}, "requestor": "assistant"} for command in commands]
    played = play(read_only, DOMAIN, task["id"], episode_scripts(task, greeting, reads)["extra_reads"])
    grepped = [
        line.split(":")[0].removeprefix("./").removesuffix(".md")
        for line in played["tool_answers"][3]["content"].splitlines()
    ]
    assert len(grepped) == 4 and all(name.startswith("doc_") for name in grepped)
    assert [search["documents"] for search in played["retrieval"]["searches"]] == [
        [first],
        [],
        [],
        list(dict.fromkeys(grepped)),
    ]
    assert played["retrieval"]["document_recall"] == round(
        len({first, *grepped} & set(task["required_documents"])) / len(set(task["required_documents"])), 6
    )
