"""The resources server's episodes of a tau2 release that runs in its own environment (v1.0.1), through workers.

v0.2.1 is the project's environment and its episodes run in process (:mod:`nemo_tau2.tau2_env`, unchanged);
a later release cannot share that environment (both install a package named ``tau2``), so the server owns two
:class:`~nemo_tau2.tau2_release.client.Tau2Worker` processes. The *episode* worker holds every live episode: each
seed, tool call and end goes there, serialised by the client's lock, on the server's event loop without ``await``
(so the replay rules of :mod:`.replay` hold as they do in process; the in-process release also runs tau2 one call
at a time). The *scoring* worker holds nothing: tau2's ``evaluate_simulation`` needs only the task and the
trajectory, so ``/verify`` scores there, on a thread of its own (:attr:`WorkerRelease.scoring`), and an NL judge
that takes seconds to answer holds up no other session's tool calls. A seed also asks the scoring worker, on that
thread, to warm the task's gold side (``tau2.warm_gold``: a forked child hashes the gold DB with tau2's code while
the episode is played), so the episode's verify finds the hash memoised. Replicas (``resources_replicas``) are the way
to scale, each with its two workers.

The trajectory scored is tau2's own message list, built by the agent as the episode is played (its ``/verify``
body's ``tau2_messages``): the release's evaluator replays its tool calls (the user's device calls too) and its NL
judge reads every message. A judge with no usable verdict is :class:`Tau2JudgeError`, a worker that died or failed
:class:`Tau2WorkerError`; the server answers both as a 502 with its cause: an infrastructure error, never a score.
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from nemo_tau2.tau2_env.domains import as_responses_tools
from nemo_tau2.tau2_env.reward import SUCCESS_TOLERANCE
from nemo_tau2.tau2_release.client import KNOWLEDGE_DOMAINS, Tau2Worker, Tau2WorkerError
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig

logger = logging.getLogger(__name__)


class ReleaseToolMessage(NamedTuple):
    """A tool's answer as the release gives it (the fields the server reads of tau2's ``ToolMessage``)."""

    content: str
    error: bool


@dataclass
class WorkerEpisode:
    """One live episode in the worker; the session store reads ``last_used`` and calls :meth:`close`."""

    worker: Tau2Worker
    domain: str
    task_id: str
    episode_id: str
    last_used: float = field(default_factory=time.monotonic)
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    closed: bool = False

    def call_tool(self, name: str, arguments: dict, requestor: str = "assistant", call_id: str = ""):
        answer = self.worker.request(
            "call_tool", episode_id=self.episode_id, name=name, arguments=arguments, requestor=requestor,
            call_id=call_id,
        )  # fmt: skip
        return self._count(ReleaseToolMessage(answer["content"] or "", bool(answer["error"])))

    def fork(self, n: int) -> list["WorkerEpisode"]:
        """``n`` independent episodes in this one's state, each a new episode of the worker's with this one's calls
        run again in it (``nemo_tau2_tau2_forks``). Raises ``Tau2RequestError`` (a call answered otherwise: no
        fork is made) and ``Tau2WorkerError``."""
        ids = self.worker.request("fork", episode_id=self.episode_id, n=n)
        self.last_used = time.monotonic()
        counts = {"num_tool_calls": self.num_tool_calls, "num_tool_errors": self.num_tool_errors}
        return [WorkerEpisode(self.worker, self.domain, self.task_id, episode_id, **counts) for episode_id in ids]

    def state_digest(self) -> str:
        """The episode's state as tau2 compares it (DB hashes, unlocked tools): equal digests, equal states."""
        return self.worker.request("digest", episode_id=self.episode_id)

    def record_failed_call(self, name: str, requestor: str, message: str) -> ReleaseToolMessage:
        """A call the release could not even represent (arguments not an object): a tool error, as in process."""
        return self._count(ReleaseToolMessage(f"Error: {message}", True))

    def _count(self, message: ReleaseToolMessage) -> ReleaseToolMessage:
        self.num_tool_calls += 1
        self.num_tool_errors += message.error
        self.last_used = time.monotonic()
        return message

    def close(self) -> None:
        """Drop the worker's episode (idle eviction, ``/end_session``, re-seed); verify already dropped it."""
        if not self.closed:
            self.closed = True
            try:
                self.worker.request("end", episode_id=self.episode_id)
            except Tau2WorkerError as e:  # its episodes went with it; the session store only forgets this one
                logger.warning("episode %s not ended in the worker: %s", self.episode_id, e)


def _fraction(checks: list[dict] | None, key: str) -> float | None:
    return sum(bool(check.get(key)) for check in checks) / len(checks) if checks else None


def components(reward_info: dict[str, Any]) -> dict[str, Any]:
    """The partial-credit components of a release's ``RewardInfo`` (JSON), under the server's field names."""
    action_checks = reward_info.get("action_checks")
    writes = [check for check in action_checks or [] if check.get("tool_type") == "write"]
    return {
        "db_match": (reward_info.get("db_check") or {}).get("db_match"),
        "action_match_fraction": _fraction(action_checks, "action_match"),
        "write_action_match_fraction": _fraction(writes, "action_match"),
        "env_assertion_fraction": _fraction(reward_info.get("env_assertions"), "met"),
        "communicate_fraction": _fraction(reward_info.get("communicate_checks"), "met"),
    }


class WorkerRelease:
    """Seeds episodes of ``config.version`` in the server's episode worker and scores them in its scoring worker
    (both started here, side by side; stopped by :meth:`close`)."""

    def __init__(self, config: Tau2ReleaseConfig):
        self.version = config.version
        self._warm_gold = config.warm_gold
        with ThreadPoolExecutor(2) as starting:  # each start imports tau2 (~10-35 s): together, not in turn
            started = [starting.submit(Tau2Worker, config) for _ in range(2)]
        workers = [future.result() for future in started if future.exception() is None]
        if len(workers) < 2:
            for worker in workers:
                worker.close()
            raise next(future.exception() for future in started if future.exception() is not None)
        self.worker, self.scorer = workers
        #: The thread ``/verify`` scores on: one, as the scoring worker answers one request at a time.
        self.scoring = ThreadPoolExecutor(1, thread_name_prefix="tau2-scoring")
        self._reward_basis: dict[str, dict[str, list[str]]] = {}

    def retrieval_variant(self, domain: str) -> str | None:
        """The variant a knowledge domain's episodes are played with (None for the other domains)."""
        return self.worker.retrieval["variant"] if domain in KNOWLEDGE_DOMAINS else None

    def load_domain_data(self, domain: str) -> None:
        """At start-up: the domain's tasks, in both workers (the scoring worker's first verify needs none then)."""
        self.scorer.request("splits", domain=domain)
        self._load_reward_basis(domain)

    def _load_reward_basis(self, domain: str) -> None:
        if domain not in self._reward_basis:
            tasks = self.worker.request("tasks", domain=domain, split=None)
            self._reward_basis[domain] = {
                str(task["id"]): list((task.get("evaluation_criteria") or {}).get("reward_basis") or [])
                for task in tasks
            }

    def start_episode(self, domain: str, task_id: str) -> tuple[WorkerEpisode, dict[str, Any]]:
        """Raises :class:`~nemo_tau2.tau2_release.client.Tau2RequestError` for an unknown domain or task."""
        seeded = self.worker.request("seed", domain=domain, task_id=task_id)
        if self._warm_gold:
            self.scoring.submit(self._warm, domain, str(task_id))
        self._load_reward_basis(domain)
        episode = WorkerEpisode(self.worker, domain, str(task_id), seeded["episode_id"])
        return episode, {
            "domain": domain,
            "task_id": str(task_id),
            "tau2_version": self.version,
            "retrieval_variant": self.retrieval_variant(domain),
            "user_system_prompt": seeded["user_system_prompt"],
            "user_tools": as_responses_tools(seeded["user_tools"]),
            "reward_basis": self._reward_basis[domain].get(str(task_id), []),
        }

    def _warm(self, domain: str, task_id: str) -> None:
        """On :attr:`scoring`: queue the task's warm-up (answered at once). A failure only costs the verify time."""
        try:
            self.scorer.request("warm", domain=domain, task_id=task_id)
        except Exception as e:  # noqa: BLE001  (the verify scores as without the warm-up, and reports its own errors)
            logger.warning("%s task %s: gold side not warmed: %s", domain, task_id, e)

    def score_episode(
        self, episode: WorkerEpisode, tau2_messages: list[dict] | None, termination_reason: str | None
    ) -> dict[str, Any]:
        """The release's verdict from the scoring worker (judge retried per ``judge.max_attempts``); touches no
        state of the episode worker, so it may run on :attr:`scoring` while that worker serves tool calls. The
        episode stays live (the server ends it once the verdict is kept). Raises ``ValueError`` (no trajectory, or
        one the release refuses), ``Tau2JudgeError`` and ``Tau2WorkerError``."""
        if tau2_messages is None:
            raise ValueError(
                f"tau2 {self.version} scores tau2's own trajectory: the /verify body needs tau2_messages (the "
                "tau2 agent sends them)"
            )
        counts = {"num_tool_calls": episode.num_tool_calls, "num_tool_errors": episode.num_tool_errors}
        return self._verdict(episode.domain, episode.task_id, tau2_messages, termination_reason, counts)

    def rescore(
        self, domain: str, task_id: str, tau2_messages: list[dict], termination_reason: str | None, counts: dict
    ) -> dict[str, Any]:
        """A stored episode's verdict, with no live episode (:mod:`.rescoring`, which counts its tool calls from the
        trajectory): the same scoring, on the same thread (:attr:`scoring`). Raises as :meth:`score_episode`."""
        return self._verdict(domain, task_id, tau2_messages, termination_reason, counts)

    def _verdict(
        self, domain: str, task_id: str, messages: list[dict], termination_reason: str | None, counts: dict
    ) -> dict[str, Any]:
        termination = termination_reason or "agent_stop"
        scored = self.scorer.score(domain, task_id, messages, termination)
        reward = scored["reward"]
        return (
            components(scored["reward_info"])
            | counts
            | {
                "reward": reward,
                "domain": domain,
                "task_id": task_id,
                "success": abs(reward - 1.0) <= SUCCESS_TOLERANCE,
                "termination_reason": termination,
                "reward_info": scored["reward_info"],
                "retrieval": scored.get(
                    "retrieval"
                ),  # a knowledge domain's searches and unlocks (worker: _search_log)
            }
        )

    def close(self) -> None:
        self.scoring.shutdown(wait=False, cancel_futures=True)
        self.worker.close()
        self.scorer.close()
