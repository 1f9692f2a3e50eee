"""Async GRPO's collector: prompt groups generated with the newest weights while the trainer trains.

A thread with its own event loop draws training rows from the curriculum (``num_prompts_per_step`` at a time,
as the synchronous loop does), rolls out each row's ``num_generations_per_prompt`` episodes through
``run_async_nemo_gym_rollout``, scores them with :func:`score_rollouts` (the synchronous loop's scoring) and filters
them with ``filter_generation_batch`` (infrastructure errors, overlong policy, dynamic sampling), then puts each
surviving group into the :class:`~nemo_tau2.algorithms.replay_buffer.ReplayBuffer` tagged with the weight version
that generated it. The trainer calls :meth:`AsyncCollector.take` once per step.

**Bound.** A group started with weight version ``v`` can train at steps ``next_step .. v + max_age`` (the steps not
yet served); the collector starts a group only while the groups buffered or in flight are fewer than
``num_prompts_per_step`` x that many steps (and never for steps past ``max_num_steps``). So it never runs further
ahead than the staleness bound lets the trainer use, and the buffer holds at most ``num_prompts_per_step x
(max_age + 1)`` groups.

**Weight updates.** :meth:`AsyncCollector.paused` stops starting groups while the trainer loads new weights.
Without in-flight updates it first waits for the running groups to finish: a group's episodes all start after one
update and end before the next, no episode mixes weights, and with the bound every group trains within its age
(the buffer's drop never fires). With ``in_flight_weight_updates`` the running episodes go on through the load:
the servers finish each turn in progress on the old weights and answer the next ones with the new (every turn's
``weight_version`` says which); a group is as old as its oldest turn, so one that finishes too late for the bound
is dropped and counted.

**Checkpoints.** :meth:`AsyncCollector.state_dict` (saved with each checkpoint) holds the curriculum and the prompt
draws not yet trained (buffered, in flight or queued). Their episodes are discarded; a resumed run regenerates
those same prompts first, with the resumed weights, under the same group ids (``draw_id``), then goes on drawing
from the restored curriculum: no prompt is trained twice and the data order is kept.
"""

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from nemo_tau2.algorithms.curriculum import TaskCurriculum, record_successes
from nemo_tau2.algorithms.grpo_config import GRPOSettings
from nemo_tau2.algorithms.replay_buffer import PromptDraw, ReplayBuffer, VersionedGroup
from nemo_tau2.algorithms.sampling import (
    DynamicSamplingExhaustedError,
    EpisodeGroup,
    FilterCounts,
    filter_generation_batch,
    score_rollouts,
)
from nemo_tau2.algorithms.train_rollouts import TrainRolloutLog
from nemo_tau2.experience.message_log import turn_weight_versions
from nemo_tau2.experience.rollouts import RolloutResult, SamplingParams, run_async_nemo_gym_rollout

logger = logging.getLogger(__name__)


class AsyncCollector:
    """Generates versioned prompt groups in a background thread; the trainer takes them by step (module docstring).

    Args:
        settings: the ``grpo`` block: group sizes, the age bound, sampling and shaping.
        weight_version: the step whose weights the generation backend serves now (the first step to train).
        state: a checkpoint's :meth:`state_dict`, whose curriculum the caller has restored into ``curriculum``.
        rollout_log: where each finished group's episodes are written, under the step the trainer works towards
            (the step whose :meth:`take` reports them).
    """

    def __init__(
        self,
        settings: GRPOSettings,
        train_rows: list[dict],
        curriculum: TaskCurriculum,
        agent_urls: dict[str, Any],
        sampling: SamplingParams,
        weight_version: int,
        state: dict[str, Any] | None = None,
        rollout_log: TrainRolloutLog | None = None,
    ) -> None:
        self.settings = settings
        self._rows, self._curriculum, self._agent_urls, self._sampling = train_rows, curriculum, agent_urls, sampling
        self._per_step, self._n = settings.num_prompts_per_step, settings.num_generations_per_prompt
        self._max_age = settings.async_grpo.max_trajectory_age_steps
        self._rollout_log = rollout_log
        self._max_groups_in_flight = max(1, settings.max_rollout_concurrency // self._n)
        self._cond = threading.Condition()
        self._buffer = ReplayBuffer()
        self._queue: deque[PromptDraw] = deque()
        self._in_flight: dict[int, PromptDraw] = {}
        self._next_draw_id = 0
        self._version = self._next_step = weight_version
        self._paused = self._stopping = False
        self._error: BaseException | None = None
        # per-step accounting, reset by take() / step_metrics()
        self._counts, self._completed, self._results = FilterCounts(), 0, []
        self._dropped, self._ages, self._spanning = 0, [], 0
        self.last_taken: list[VersionedGroup] = []  # the groups of the latest take(), with versions and times
        self._generation_idle_s = self._trainer_idle_s = 0.0
        self._idle_since: float | None = time.monotonic()
        self._window_start = time.monotonic()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        if state is not None:
            self._load_state_dict(state)

    # ------------------------------------------------------------------------------------------ trainer side

    def start(self) -> None:
        with self._cond:  # the idle accounting starts with the collector, not with its construction
            self._idle_since = self._window_start = time.monotonic()
        ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(ready),), name="async-collector")
        self._thread.daemon = True
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Stop starting groups and cancel the running ones (their episodes are discarded); safe to call twice."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._wake_collector()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None

    def take(self, step: int) -> tuple[list[EpisodeGroup], list[RolloutResult], dict[str, float]]:
        """``num_prompts_per_step`` groups for ``step`` (waiting for them), the episodes finished since the last
        take (every one, kept or filtered, as the synchronous loop reports a step's rollouts) and sampling
        metrics with the synchronous loop's names."""
        started = time.monotonic()
        with self._cond:
            if self._thread is None:
                raise RuntimeError("take(): the collector is not running; call start() first")
            if step != self._next_step:
                raise ValueError(f"take({step}): the next step to serve is {self._next_step}")
            while True:
                self._raise_if_failed()
                taken, stale = self._buffer.take(self._per_step, step, self._max_age)
                self._dropped += len(stale)
                for group in stale:
                    logger.warning("dropped group %d: weights of step %d, too old for step %d", group.draw.draw_id,
                                   group.weight_version, step)  # fmt: skip
                if taken:
                    break
                max_batches = self.settings.dynamic_sampling_max_gen_batches
                if self._completed >= max_batches * self._per_step:
                    raise DynamicSamplingExhaustedError(
                        f"{self._completed} groups finished since the last step and fewer than num_prompts_per_step="
                        f"{self._per_step} were usable ({self._counts.zero_variance_groups} had equal rewards, "
                        f"{self._counts.infra_errors} episodes had infrastructure errors; "
                        f"dynamic_sampling_max_gen_batches={max_batches}). Raise num_generations_per_prompt or "
                        "dynamic_sampling_max_gen_batches, or start from a stronger (SFT) policy."
                    )
                if stale:
                    self._wake_collector()  # dropping freed room under the bound
                self._cond.wait()
            self._next_step = step + 1
            self._ages, self.last_taken = [group.age_at(step) for group in taken], taken
            self._spanning = sum(len(set(group.turn_weight_versions)) > 1 for group in taken)
            groups = [group.group for group in taken]
            metrics = {
                "train/num_infra_errors": self._counts.infra_errors,
                "train/num_truncated": self._counts.truncated,
                "train/num_groups": len(groups),
                "train/num_episodes": sum(len(group.episodes) for group in groups),
                "train/dynamic_sampling/num_gen_batches": self._completed / self._per_step,
                "train/dynamic_sampling/num_zero_variance_groups": self._counts.zero_variance_groups,
                "train/dynamic_sampling/num_discarded_groups": 0,
                "train/async/group_ids": [group.draw.draw_id for group in taken],  # metrics.jsonl only (not a scalar)
            }
            results, self._results, self._counts, self._completed = self._results, [], FilterCounts(), 0
            self._trainer_idle_s += time.monotonic() - started
        self._wake_collector()
        return groups, results, metrics

    @contextlib.contextmanager
    def paused(self, new_weight_version: int | None = None) -> Iterator[None]:
        """No group starts inside: load weights (give their version) or validate. None is running inside, except
        for a weight load with in-flight updates (module docstring)."""
        started = time.monotonic()
        in_flight_ok = new_weight_version is not None and self.settings.async_grpo.in_flight_weight_updates
        with self._cond:
            if new_weight_version is not None and new_weight_version <= self._version:
                raise ValueError(f"weight version {new_weight_version} is not after {self._version}")
            self._paused = True
            while self._in_flight and not in_flight_ok:
                self._raise_if_failed()
                self._cond.wait()
            self._trainer_idle_s += time.monotonic() - started
        loaded = False
        try:
            yield
            loaded = True
        finally:
            with self._cond:
                if new_weight_version is not None and loaded:  # a failed load leaves the old version served
                    self._version = new_weight_version
                self._paused = False
            self._wake_collector()

    def step_metrics(self) -> dict[str, float]:
        """``train/async/*`` since the previous call: the ages of the groups taken (and how many of them ran through
        a weight update), the buffer, the groups dropped for age, and the share of the time the generation side (no
        group running) and the trainer (waiting for groups or for running episodes before a weight update) sat
        idle."""
        with self._cond:
            now = time.monotonic()
            if self._idle_since is not None:
                self._generation_idle_s += now - self._idle_since
                self._idle_since = now
            window = max(now - self._window_start, 1e-9)
            metrics = {
                "train/async/trajectory_age_mean": sum(self._ages) / len(self._ages) if self._ages else 0.0,
                "train/async/trajectory_age_max": float(max(self._ages, default=0)),
                "train/async/buffer_size": float(len(self._buffer)),
                "train/async/groups_dropped_for_age": float(self._dropped),
                "train/async/groups_spanning_weight_updates": float(self._spanning),
                "train/async/generation_idle_fraction": min(1.0, self._generation_idle_s / window),
                "train/async/trainer_idle_fraction": min(1.0, self._trainer_idle_s / window),
            }
            self._dropped, self._generation_idle_s, self._trainer_idle_s, self._window_start = 0, 0.0, 0.0, now
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The curriculum and the prompt draws not yet trained, as one consistent snapshot (module docstring)."""
        with self._cond:
            pending = sorted([*self._buffer.draws(), *self._in_flight.values(), *self._queue], key=lambda d: d.draw_id)
            return {
                "curriculum": self._curriculum.state_dict(),
                "async_collector": {
                    "pending_draws": [[draw.draw_id, draw.row_index] for draw in pending],
                    "next_draw_id": self._next_draw_id,
                },
            }

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("async_collector") or {"pending_draws": [], "next_draw_id": 0}
        for draw_id, row_index in saved["pending_draws"]:
            if not 0 <= row_index < len(self._rows):
                raise ValueError(f"checkpoint: pending prompt {draw_id} names row {row_index} of {len(self._rows)}")
            self._queue.append(PromptDraw(int(draw_id), int(row_index)))
        self._next_draw_id = int(saved["next_draw_id"])

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the async GRPO collector failed: {self._error!r}") from self._error

    def _wake_collector(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed in between
                loop.call_soon_threadsafe(wake.set)

    # ------------------------------------------------------------------------------------------ collector side

    def _admit(self) -> tuple[PromptDraw, int] | None:
        """The next prompt to roll out and the weight version it uses, if the bound allows one now (under lock)."""
        if self._paused or self._stopping or self._error is not None:
            return None
        if len(self._in_flight) >= self._max_groups_in_flight:
            return None
        last_step = min(self._version + self._max_age, self.settings.max_num_steps - 1)
        room = self._per_step * max(0, last_step - self._next_step + 1)
        if len(self._buffer) + len(self._in_flight) >= room:
            return None
        if not self._queue:
            too_few_rows = len(self._rows) < self._per_step
            for row_index in self._curriculum.sample(self._per_step, replace=too_few_rows):
                self._queue.append(PromptDraw(self._next_draw_id, row_index))
                self._next_draw_id += 1
        draw = self._queue.popleft()
        self._in_flight[draw.draw_id] = draw
        if self._idle_since is not None:
            self._generation_idle_s += time.monotonic() - self._idle_since
            self._idle_since = None
        return draw, self._version

    async def _run(self, ready: threading.Event) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        running: set[asyncio.Task] = set()
        try:
            while True:
                self._wake.clear()
                with self._cond:
                    if self._stopping:
                        return
                    admitted = self._admit()
                if admitted is None:
                    await self._wake.wait()
                    continue
                task = asyncio.create_task(self._roll_out(*admitted))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _roll_out(self, draw: PromptDraw, version: int) -> None:
        started = time.monotonic()
        try:
            rows = [self._rows[draw.row_index]] * self._n
            results: list[RolloutResult] = []
            keep = self._rollout_log is not None and self._rollout_log.keeps_transcripts
            async for group in run_async_nemo_gym_rollout(
                rows, self._agent_urls, self._sampling, self._n, max_concurrency=self._n, keep_full_result=keep
            ):
                results = group.results
            scored = score_rollouts(results, [draw.draw_id] * self._n, self.settings.reward_shaping)
            groups, counts = filter_generation_batch(scored, self.settings.sampling_config())
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # the trainer re-raises it from take() / paused()
            logger.exception("async collector: rolling out prompt %d failed", draw.draw_id)
            with self._cond:
                self._error = e
                self._cond.notify_all()
            return
        with self._cond:
            record_successes(self._curriculum, results)
            del self._in_flight[draw.draw_id]
            if not self._in_flight:
                self._idle_since = time.monotonic()
            self._completed += 1
            self._results += results
            if self._rollout_log is not None:  # as metrics.jsonl numbers the step whose take() reports them
                self._rollout_log.write(self._next_step + 1, results)
            for name in ("infra_errors", "truncated", "zero_variance_groups"):
                setattr(self._counts, name, getattr(self._counts, name) + getattr(counts, name))
            if groups:
                turns = sorted({v for result in results for v in turn_weight_versions(result.message_log)})
                # as old as the oldest weights that sampled a turn (the version at the start if none is reported)
                oldest = min(turns, default=version)
                group = VersionedGroup(draw, oldest, groups[0], results, started, time.monotonic(), turns or [version])
                self._buffer.push(group)
            self._cond.notify_all()
        assert self._wake is not None
        self._wake.set()
