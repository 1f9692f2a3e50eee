"""Scripted episodes of a tau2 task, built from the task's JSON alone (standard library only).

The parity test plays each script twice, through nemo-tau2's worker in tau2 v1.0.1's environment and through
tau2 v1.0.1 directly (``v1_reference.py``), so the script is the only thing both sides share. Per task: the oracle
(every gold action, then every ``communicate_info`` said) and perturbations: ``wrong_message`` (the closing message
says nothing required, and the scripted judge fails every NL assertion on it), ``wrong_write`` (one argument of the
last gold action with arguments changed) or, for tasks without one, ``missing_action`` (the last gold action
dropped) or a premature ``max_steps`` end for tasks with no gold action at all. banking_knowledge's tasks add what
its discoverable tools make possible: ``call_without_unlock`` (the first unlock dropped, its call kept),
``no_verification`` (``log_verification`` dropped) and ``extra_reads`` (a knowledge-base search and a list of the
discoverable tools before the gold actions).
"""

import copy

USER_OPENING = "Hello, I need some help with my request."
USER_CLOSING = "Thanks, that is all. ###STOP###"
FAILED_CLOSING = "Sorry, I could not help with that."
JUDGE_FAIL_MARKER = "could not help"  # the scripted judge fails every assertion of a conversation containing it


def _perturb_value(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "_x"
    return None


def _wrong_write(actions: list[dict]) -> list[dict] | None:
    for index in range(len(actions) - 1, -1, -1):
        for key, value in actions[index].get("arguments", {}).items():
            changed = _perturb_value(value)
            if changed is not None:
                perturbed = copy.deepcopy(actions)
                perturbed[index]["arguments"][key] = changed
                return perturbed
    return None


def _steps(greeting: str, actions: list[dict], closing: str) -> list[tuple]:
    steps: list[tuple] = [("text", "assistant", greeting), ("text", "user", USER_OPENING)]
    for action in actions:
        steps.append(("call", action.get("requestor", "assistant"), action["name"], action.get("arguments", {})))
    steps += [("text", "assistant", closing), ("text", "user", USER_CLOSING)]
    return steps


#: ``extra_reads``' knowledge-base reads by default (a KB_search variant's); a shell variant reads with ``shell``.
DEFAULT_READS = [{"name": "KB_search", "arguments": {"query": "account fees"}, "requestor": "assistant"}]


def episode_scripts(task: dict, greeting: str, reads: list[dict] | None = None) -> dict[str, dict]:
    """Name -> {"steps": [...], "termination_reason": ...} for one task (tau2's JSON of it); ``reads``: the calls
    ``extra_reads`` makes to the knowledge base (default :data:`DEFAULT_READS`)."""
    criteria = task.get("evaluation_criteria") or {}
    actions = criteria.get("actions") or []
    oracle_closing = " ".join(["Done."] + list(criteria.get("communicate_info") or []))
    scripts = {
        "oracle": {"steps": _steps(greeting, actions, oracle_closing), "termination_reason": "user_stop"},
        "wrong_message": {"steps": _steps(greeting, actions, FAILED_CLOSING), "termination_reason": "user_stop"},
    }
    wrong = _wrong_write(actions)
    if wrong is not None:
        scripts["wrong_write"] = {"steps": _steps(greeting, wrong, oracle_closing), "termination_reason": "user_stop"}
    elif actions:
        scripts["missing_action"] = {
            "steps": _steps(greeting, actions[:-1], oracle_closing),
            "termination_reason": "user_stop",
        }
    else:
        steps = _steps(greeting, actions, oracle_closing)
        scripts["premature_end"] = {"steps": steps, "termination_reason": "max_steps"}
    for name, perturbed in _discoverable_perturbations(actions, reads or DEFAULT_READS).items():
        scripts[name] = {"steps": _steps(greeting, perturbed, oracle_closing), "termination_reason": "user_stop"}
    return scripts


def _discoverable_perturbations(actions: list[dict], knowledge_reads: list[dict]) -> dict[str, list[dict]]:
    """banking_knowledge's ways to get its discoverable tools wrong (none for a task that uses none)."""
    names = [action["name"] for action in actions]
    perturbations = {}
    if "unlock_discoverable_agent_tool" in names:
        first = names.index("unlock_discoverable_agent_tool")
        perturbations["call_without_unlock"] = actions[:first] + actions[first + 1 :]
    if "log_verification" in names:
        perturbations["no_verification"] = [action for action in actions if action["name"] != "log_verification"]
    if any(name.endswith("discoverable_agent_tool") or name == "log_verification" for name in names):
        reads = [
            *knowledge_reads,
            {"name": "list_discoverable_agent_tools", "arguments": {}, "requestor": "assistant"},
        ]
        perturbations["extra_reads"] = reads + actions
    return perturbations
