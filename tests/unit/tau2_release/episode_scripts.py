"""Scripted episodes of a tau2 task, built from the task's JSON alone (standard library only).

The parity test plays each script twice, through nemo-tau2's worker in tau2 v1.0.1's environment and through
tau2 v1.0.1 directly (``v1_reference.py``), so the script is the only thing both sides share. Per task: the oracle
(every gold action, then every ``communicate_info`` said) and perturbations: ``wrong_message`` (the closing message
says nothing required, and the scripted judge fails every NL assertion on it), ``wrong_write`` (one argument of the
last gold action with arguments changed) or, for tasks without one, ``missing_action`` (the last gold action
dropped) or a premature ``max_steps`` end for tasks with no gold action at all.
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


def episode_scripts(task: dict, greeting: str) -> dict[str, dict]:
    """Name -> {"steps": [...], "termination_reason": ...} for one task (tau2's JSON of it)."""
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
    return scripts
