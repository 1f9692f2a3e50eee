"""Pivots out of stored trajectories, profiled by a frozen policy, on tau2 v0.2.1 (``prepare_pivots.py``,
``profile_pivots.py``, against the session's real resources server).

The trajectories are gold episodes (each task's gold actions played in a real episode, their answers recorded), kept
three ways: our ``rollouts.jsonl``, tau2 v0.2.1's own results file (its ``Results`` model, saved as ``tau2 run``
saves it) and an SFT conversations file (OpenAI chat). The three give the same pivots. The policy is a scripted
OpenAI-compatible server on 127.0.0.1 (only its behaviour is scripted): for each prompt it answers a schedule of
right and wrong actions, so the profile's rewards, PivotRL's filter and the kept file are known. An endpoint outage
is recorded as an error, never a score, and a rerun profiles only what it left; a pivot cut from edited data is
refused with its reason.
"""

import importlib.util
import json
from pathlib import Path

import orjson
import pytest

from nemo_tau2.gym.model_server.conversion import chat_request
from nemo_tau2.pivots.gold import gold_trajectory
from nemo_tau2.tau2_env import domains
from nemo_tau2.testing.scheduled_chat import ScheduledChat, prompt_key

TASKS = [("airline", "7"), ("retail", "0")]
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def script(name: str):
    """An example script as a module (its ``main(argv)`` run in this process: the same code as the command)."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prepare_pivots, profile_pivots = script("prepare_pivots"), script("profile_pivots")


def gold_messages(domain: str, task_id: str) -> list[dict]:
    opening, closing = "Hi, I need help with my booking.", "All done. Anything else?"
    return gold_trajectory(domain, task_id, opening=opening, closing=closing).tau2_messages


def chat_of(messages: list[dict]) -> list[dict]:
    chat = []
    for message in messages:
        if message["role"] == "tool":
            chat.append({"role": "tool", "tool_call_id": message["id"], "content": message["content"]})
        elif message.get("tool_calls"):
            calls = [{"id": call["id"], "type": "function",
                      "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
                     for call in message["tool_calls"]]  # fmt: skip
            chat.append({"role": "assistant", "content": None, "tool_calls": calls})
        else:
            chat.append({"role": message["role"], "content": message["content"]})
    return chat


def write_sources(folder: Path) -> dict[str, Path]:
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
    from tau2.data_model.simulation import Results, RewardInfo, SimulationRun, TerminationReason
    from tau2.run import get_info

    rollouts, conversations, results = folder / "rollouts.jsonl", folder / "conversations.jsonl", {}
    lines, chats = [], []
    for domain, task_id in TASKS:
        messages = gold_messages(domain, task_id)
        base = {"domain": domain, "task_id": task_id, "tau2_version": "v0.2.1", "reward": 1.0}
        lines.append(json.dumps(base | {"status": "ok", "sample_index": 0, "tau2_messages": messages}))
        lines.append(json.dumps(base | {"status": "error", "sample_index": 1}))  # not played: skipped
        chats.append(json.dumps({"domain": domain, "task_id": task_id, "messages": chat_of(messages)}))
        kinds = {"assistant": AssistantMessage, "user": UserMessage, "tool": ToolMessage}
        run = SimulationRun(
            id=f"{domain}-{task_id}", task_id=task_id, start_time="", end_time="", duration=0.0,
            termination_reason=TerminationReason.AGENT_STOP, reward_info=RewardInfo(reward=1.0),
            messages=[kinds[m["role"]].model_validate(m) for m in messages], trial=0,
        )  # fmt: skip
        info = get_info(domain, "llm_agent", "user_simulator", llm_agent="gold", llm_user="gold")
        results[domain] = folder / f"{domain}.results.json"
        Results(info=info, tasks=[domains.get_task(domain, task_id)], simulations=[run]).save(results[domain])
    rollouts.write_text("\n".join(lines) + '\n{"torn": ')
    conversations.write_text("\n".join(chats) + "\n")
    return {"rollouts": rollouts, "conversations": conversations, **results}


def prompt_of(pivot: dict) -> str:
    return prompt_key(chat_request(pivot["responses_create_params"], with_token_ids=False)["messages"])


def said(text: str) -> dict:
    return {"role": "assistant", "content": text}


def called(action: dict, arguments: dict | None = None) -> dict:
    args = json.dumps(arguments) if arguments is not None else action["arguments"]
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": action["name"], "arguments": args}}]}  # fmt: skip


@pytest.fixture(scope="module")
def policy():
    with ScheduledChat() as scripted:
        yield scripted


def test_pivots_from_three_sources_profiled_filtered_and_resumed(resources_server_url, policy, tmp_path, capsys):
    sources = write_sources(tmp_path)
    outputs = {}
    for name, flags in {"rollouts": ["--rollouts", sources["rollouts"]], "conversations": ["--conversations",
                        sources["conversations"]], "tau2": ["--tau2-results", sources["airline"], "--tau2-results",
                        sources["retail"]]}.items():  # fmt: skip
        outputs[name] = tmp_path / f"{name}.pivots.jsonl"
        assert prepare_pivots.main([*map(str, flags), "--output", str(outputs[name])]) == 0
    named = tmp_path / "named.pivots.jsonl"
    assert (
        prepare_pivots.main(["--rollouts", str(sources["rollouts"]), "--output", str(named), "--agent-name", "mine"])
        == 0
    )
    assert {orjson.loads(line)["agent_ref"]["name"] for line in named.read_bytes().splitlines()} == {"mine"}
    said_lines = capsys.readouterr().out
    assert "skipped 1: torn line" in said_lines and "skipped 2: not played to its end" in said_lines, said_lines
    read = {name: [orjson.loads(line) for line in path.read_bytes().splitlines()] for name, path in outputs.items()}
    keys = ("responses_create_params", "expected_action", "tau2_messages", "domain", "task_id", "turn", "split")
    for name in ("conversations", "tau2"):  # the same pivots, whatever kept the trajectory
        assert [{key: row[key] for key in keys if key != "tau2_messages"} for row in read[name]] == [
            {key: row[key] for key in keys if key != "tau2_messages"} for row in read["rollouts"]]  # fmt: skip
    pivots = read["rollouts"]
    gold_calls = sum(len(domains.get_task(d, t).evaluation_criteria.actions) for d, t in TASKS)
    assert len(pivots) == gold_calls + len(TASKS)  # every gold call, and the closing text, of each task
    assert pivots[0]["responses_create_params"]["input"][-1] == {
        "role": "user",
        "content": "Hi, I need help with my booking.",
    }
    for row in pivots:  # each pivot marked with its task's tau2 split: the test split's are held out
        held_out = row["task_id"] in domains.task_splits(row["domain"]).get("test", ())
        assert row["split"] == ("test" if held_out else "train"), row["split"]

    for index, pivot in enumerate(pivots):  # what the policy answers at each pivot, in turn
        action = pivot["expected_action"]
        if action["type"] == "message":
            schedule = [said("Glad to help."), called({"name": "transfer_to_human_agents", "arguments": "{}"})]
        elif index % 3 == 0:
            schedule = [called(action)]  # always right: all 1, not a pivot
        elif index % 3 == 1:
            schedule = [called(action), said("Let me check that.")]  # mixed: a pivot
        else:
            schedule = [said("One moment.")]  # never right: all 0, not a pivot
        policy.schedules[prompt_of(pivot)] = schedule
    outage = prompt_of(pivots[1])
    policy.down.add(outage)

    kept_path, profile_path = tmp_path / "kept.jsonl", tmp_path / "pivots.profile.jsonl"
    args = ["--pivots", str(outputs["rollouts"]), "--output", str(kept_path), "--profile", str(profile_path),
            "--policy-url", policy.url, "--model", "scripted", "--samples", "4", "--resources-url",
            resources_server_url]  # fmt: skip
    assert profile_pivots.main(args) == 0
    first = [orjson.loads(line) for line in profile_path.read_bytes().splitlines()]
    assert [line["status"] for line in first].count("error") == 1, first
    assert policy.served.get(outage, 0) == 0

    policy.down.clear()
    served_before = dict(policy.served)
    assert profile_pivots.main(args) == 0
    assert {
        key: count - served_before.get(key, 0)
        for key, count in policy.served.items()
        if count != served_before.get(key, 0)
    } == {outage: 4}  # only the outage's candidate again
    settled = {}
    for line in (orjson.loads(line) for line in profile_path.read_bytes().splitlines()):
        settled[line["pivot_id"]] = line
    expected_kept = []
    for index, pivot in enumerate(pivots):
        line = settled[pivot["pivot_id"]]
        assert line["status"] == "ok", line
        if pivot["expected_action"]["type"] == "message":
            assert sorted(line["rewards"]) == [0.0, 0.0, 1.0, 1.0] and line["kept"], line  # samples run concurrently
            assert sorted(line["categories"]) == ["message", "message", "message_expected", "message_expected"]
        else:
            rewards = {0: [1.0] * 4, 1: [1.0, 0.0, 1.0, 0.0], 2: [0.0] * 4}[index % 3]
            assert sorted(line["rewards"]) == sorted(rewards), (index, line)
            assert line["kept"] == (index % 3 == 1)
        if line["kept"]:
            expected_kept.append(pivot["pivot_id"])
    kept = [orjson.loads(line)["pivot_id"] for line in kept_path.read_bytes().splitlines()]
    assert kept == expected_kept
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["by_domain"]["airline"]["kept"] + summary["by_domain"]["retail"]["kept"] == len(expected_kept)


def test_a_pivot_of_other_data_is_refused_and_bad_input_is_one_line(resources_server_url, policy, tmp_path, capsys):
    sources = write_sources(tmp_path)
    pivots_path = tmp_path / "pivots.jsonl"
    assert prepare_pivots.main(["--rollouts", str(sources["rollouts"]), "--output", str(pivots_path)]) == 0
    pivot = orjson.loads(pivots_path.read_bytes().splitlines()[-1])
    answered = next(i for i, m in enumerate(pivot["tau2_messages"]) if m["role"] == "tool")
    pivot["tau2_messages"][answered]["content"] = "an answer this data never gave"
    pivot["pivot_id"] = "edited"
    edited = tmp_path / "edited.jsonl"
    edited.write_bytes(orjson.dumps(pivot) + b"\n")
    policy.schedules[prompt_of(pivot)] = [said("Hello")]
    args = ["--pivots", str(edited), "--output", str(tmp_path / "kept.jsonl"), "--policy-url", policy.url,
            "--model", "scripted", "--resources-url", resources_server_url]  # fmt: skip
    assert profile_pivots.main(args) == 0
    line = orjson.loads((tmp_path / "edited.profile.jsonl").read_bytes())
    assert line["status"] == "refused" and "cannot be rebuilt" in line["detail"], line

    capsys.readouterr()
    for argv in (["--output", "x.jsonl"], ["--rollouts", str(tmp_path / "nope"), "--output", "x.jsonl"]):
        with pytest.raises(SystemExit) as exit_:
            prepare_pivots.main(argv)
        assert exit_.value.code == 2
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    assert profile_pivots.main(["--pivots", str(tmp_path / "bad.jsonl"), *args[2:]]) == 2
    assert "not JSON" in capsys.readouterr().err
