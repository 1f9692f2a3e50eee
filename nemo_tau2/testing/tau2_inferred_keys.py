"""Conversation keys for tau2 clients that send none: the task and the side recognised from what the request holds.

Our agent names each episode in the request's ``user`` field. Other tau2 harnesses (tau2's own runner, NeMo-Gym
0.7.0's tau2 agent, which drive tau2's orchestrator through litellm) send no key, so the fake server recognises the
conversation instead (``missing_key: tau2``):

- **The user's side** (tau2's user simulator: its own messages are ``assistant``, the agent's are ``user``): its
  system prompt holds the task's scenario (``<scenario>`` in tau2's user prompt); the task whose reason for calling
  (or whose whole instructions, when they are a string) that scenario holds, the longest where one holds another.
- **The policy's side**: its first ``user`` message is the scripted user's opening (:func:`opening_text`), which
  names the task.

Where tasks share an opening (telecom's tasks of one issue differ only in their device's state), the request's
``seed`` names the task: tau2 sends its run's seed on every request of both sides, so a harness that gives each
episode its own seed registers ``seed -> (domain, task)`` (``inferred_key_seeds``), and each episode gets a key of
its own. Tasks are those of ``inferred_key_domains`` (a later release's where ``tau2.release_tasks`` gives them).
Without a seed, two tasks of the same opening cannot be told apart: a request naming one is refused, saying so.
The key's episode id is then ``inferred``: every episode of one task shares a key, whose turn base is the same for
all (the greeting), so concurrent episodes are each answered at their own turn.
"""

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any

from nemo_tau2.testing.release_tasks import release_task_ids
from nemo_tau2.testing.scripts import ScriptError
from nemo_tau2.testing.tau2_scripts import _instruction_field, _text, opening_text, task_of, tau2_key

INFERRED_EPISODE = "inferred"


def _words(text: str) -> str:
    return " ".join(text.split())


def _scenario_text(task: Any) -> str:
    """What of the task tau2's user prompt holds verbatim: the reason for calling, or the instructions string."""
    instructions = task.user_scenario.instructions
    if isinstance(instructions, str):
        return _words(instructions)
    return _instruction_field(task, "reason_for_call") or ""


@dataclass
class _DomainIndex:
    openings: dict[str, str] = field(default_factory=dict)  # opening -> task id
    ambiguous: dict[str, list[str]] = field(default_factory=dict)  # opening -> the task ids sharing it
    scenarios: list[tuple[str, str]] = field(default_factory=list)  # (scenario text, task id), longest first


class Tau2KeyInference:
    """Recognises a keyless tau2 request's task and side among the tasks of ``domains``; ``seeds`` (a request's
    ``seed`` -> ``(domain, task_id)``) names the task where its opening is another's too."""

    def __init__(self, domains: list[str], seeds: dict[int, tuple[str, str]] | None = None) -> None:
        if not domains:
            raise ValueError("missing_key 'tau2' needs inferred_key_domains: the domains whose tasks are matched")
        self.domains = list(domains)
        self.seeds = dict(seeds or {})
        self._indexes: dict[str, _DomainIndex] | None = None
        self._lock = threading.Lock()

    def key_of(self, body: dict[str, Any]) -> str:
        """The tau2 key of a keyless request. Raises :class:`ScriptError` naming what could not be recognised."""
        messages = body.get("messages") or []
        system = _words(_text(messages[0])) if messages and messages[0].get("role") == "system" else ""
        side = "user" if "<scenario>" in system else "policy"  # tau2's user prompt holds the scenario
        seed = body.get("seed")
        if isinstance(seed, int) and seed in self.seeds:  # tau2 sends its run's seed on both sides' requests
            domain, task_id = self.seeds[seed]
            return tau2_key(domain, task_id, f"seed{seed}", side)
        indexes = self._built()
        own = "assistant" if side == "user" else "user"  # whose messages hold the user's opening
        texts = [
            _words(_text(message))
            for message in messages[1:]
            if message.get("role") == own and not message.get("tool_calls")
        ]
        for domain, index in indexes.items():
            for text in texts:
                task_id = self._opening_task(domain, index, text)
                if task_id is not None:
                    return tau2_key(domain, task_id, INFERRED_EPISODE, side)
        if side == "user":  # the user's first turn: only its prompt names the task
            for domain, index in indexes.items():
                for scenario, task_id in index.scenarios:
                    if scenario and scenario in system:
                        return tau2_key(domain, task_id, INFERRED_EPISODE, "user")
        raise ScriptError(
            "the request has no conversation key and is not a tau2 conversation of a task of "
            f"{self.domains}: no message is a task's opening, no <scenario> names one, and its seed {seed!r} "
            "is not one of inferred_key_seeds"
        )

    @staticmethod
    def _opening_task(domain: str, index: _DomainIndex, text: str) -> str | None:
        if text in index.ambiguous:
            raise ScriptError(
                f"the opening of {domain} tasks {index.ambiguous[text]} is the same: a keyless request cannot say "
                "which it is (send a key in the request's key field)"
            )
        return index.openings.get(text)

    def _built(self) -> dict[str, _DomainIndex]:
        with self._lock:
            if self._indexes is None:
                self._indexes = {domain: _index(domain) for domain in self.domains}
            return self._indexes


def _domain_task_ids(domain: str) -> list[str]:
    from nemo_tau2.tau2_env import domains

    ids = list(release_task_ids(domain))
    known = set(ids)
    with contextlib.suppress(ValueError):  # a domain only the release has (banking_knowledge)
        ids += [task.id for task in domains.get_tasks(domain, "base") if task.id not in known]
    if not ids:
        raise ValueError(f"inferred_key_domains: no tasks of domain {domain!r} (tau2 v0.2.1's or tau2.release_tasks')")
    return ids


def _index(domain: str) -> _DomainIndex:
    index = _DomainIndex()
    seen: dict[str, list[str]] = {}
    for task_id in _domain_task_ids(domain):
        task = task_of(domain, task_id)
        seen.setdefault(_words(opening_text(task)), []).append(task_id)
        index.scenarios.append((_scenario_text(task), task_id))
    for opening, task_ids in seen.items():
        if len(task_ids) == 1:
            index.openings[opening] = task_ids[0]
        else:
            index.ambiguous[opening] = task_ids
    index.scenarios.sort(key=lambda pair: -len(pair[0]))  # a scenario holding another's text is matched first
    return index
