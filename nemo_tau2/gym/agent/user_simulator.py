"""The simulated user, as tau2's ``UserSimulator`` plays it, with tau-bench's strategies on top.

Each user message is one call to the user model: tau2's user system prompt, then the conversation with roles
flipped (the agent's messages as ``user``, the user's own as ``assistant``, its device calls and their results), the
user's device tools in telecom, tau2's trial seed, and the configured sampling parameters. An empty answer is asked
again up to ``user_empty_retries`` times, then the episode ends as tau2's ``user_error``. Strategies
(:mod:`.user_strategies`) add format instructions and check or reflection calls; every call is counted in
``state.user_simulator``.

The model call itself is the caller's: the agent server posts to its user model server, ``Tau2Env`` calls the
user endpoint in process or a Gym model server by URL.
"""

import logging
import random
from array import array
from collections.abc import Awaitable, Callable

import orjson

from nemo_tau2.gym.agent import user_strategies as strategies
from nemo_tau2.gym.agent.conversation import EpisodeState
from nemo_tau2.gym.agent.turns import Turn, message_item, read_turn
from nemo_tau2.gym.episode_config import EpisodeSettings

logger = logging.getLogger(__name__)

ModelCall = Callable[[EpisodeState, dict], Awaitable[dict]]  # a Responses request -> the Responses object


_trial_seeds: dict[int, tuple[random.Random, array]] = {}  # base seed -> its generator and the seeds drawn so far


def tau2_trial_seed(base_seed: int, trial: int) -> int:
    """The seed tau2's ``run_domain`` gives trial ``trial`` (``random.seed(base); randint(0, 1e6)`` per trial).

    Trial k is the (k + 1)-th draw: drawing them again for every user call cost O(k) each (40 ms at k = 100,000, the
    agent's hot spot where sample indexes are large), so each base seed's draws are kept (8 bytes each; the row's
    ``sample_index`` is at most ``MAX_SAMPLE_INDEX``) and extended on demand."""
    rng, seeds = _trial_seeds.setdefault(base_seed, (random.Random(base_seed), array("q")))
    while len(seeds) <= trial:
        seeds.append(rng.randint(0, 1000000))
    return seeds[trial]


class UserSimulator:
    """Plays the user of every episode it is given (state lives in each episode)."""

    def __init__(self, settings: EpisodeSettings, call_model: ModelCall):
        self.settings = settings
        self.strategy = settings.user_strategy.strategy
        self.call_model = call_model
        if self.strategy in strategies.CHECKED_STRATEGIES and not settings.user_responses_create_params.get(
            "temperature"
        ):
            logger.warning(
                "user strategy %s at temperature 0: a regenerated message repeats the rejected one", self.strategy
            )

    async def __call__(self, state: EpisodeState) -> Turn | None:
        """The user's next turn (a message or device calls); None if the user model stays silent."""
        turn = await self._generate(state)
        if turn is None or turn.calls:
            return self._record(state, turn, turn.text if turn else "")
        raw = turn.text
        if self.strategy == "react":
            message = strategies.react_message(raw)
            if message is None:
                state.user_simulator.format_fallbacks += 1
            turn = Turn(turn.items, message or raw, [], turn.truncated)
        elif self.strategy == "verify":
            turn = await self._verified(state, turn)
            raw = turn.text
        elif self.strategy == "reflection":
            turn = await self._reflected(state, turn)
            raw = turn.text
        return self._record(state, turn, raw)

    def _record(self, state: EpisodeState, turn: Turn | None, raw: str) -> Turn | None:
        """Add the turn to the user's own history (react keeps its thought there)."""
        if turn is None:
            return None
        state.user_turns += 1
        if turn.calls:
            state.user_history.extend(item for item in turn.items if item.get("type") == "function_call")
        else:
            state.user_history.append(message_item("assistant", raw))
        return turn

    # ------------------------------------------------------------------ user model calls
    def _body(
        self, state: EpisodeState, items: list[dict], role: str, tools: list[dict] | None = None, attempt: int = 0
    ) -> dict:
        body = dict(self.settings.user_responses_create_params) | {"input": items, "user": state.key(role)}
        if tools:
            body["tools"] = tools
        if self.settings.user_seed is not None:
            seed = tau2_trial_seed(self.settings.user_seed, state.sample_index) + attempt
            body["metadata"] = {"extra_body": orjson.dumps({"seed": seed}).decode()}
        return body

    async def _generate(self, state: EpisodeState, attempt: int = 0) -> Turn | None:
        """One user message (or device calls); None if it stays empty after ``user_empty_retries`` retries."""
        system_prompt = state.user_system_prompt
        if self.strategy == "react":
            system_prompt = f"{system_prompt}\n\n{strategies.REACT_INSTRUCTIONS}"
        items = [message_item("system", system_prompt)] + state.user_history
        body = self._body(state, items, "user", state.user_tools, attempt)
        for _ in range(self.settings.user_empty_retries + 1):
            state.user_simulator.model_calls += 1
            turn = read_turn(await self.call_model(state, body), lenient=bool(state.user_tools))
            if turn.calls or turn.text.strip():
                return turn
        return None

    async def _review(self, state: EpisodeState, candidate: str, role: str) -> str:
        """One check (``user_check``) or reflection (``user_reflect``) call about a candidate message."""
        system, question = {
            "user_check": (strategies.CHECK_SYSTEM_PROMPT, strategies.CHECK_QUESTION),
            "user_reflect": (strategies.REFLECT_SYSTEM_PROMPT, strategies.REFLECT_QUESTION),
        }[role]
        prompt = strategies.review_prompt(state.user_system_prompt, state.user_history, candidate, question)
        body = self._body(state, [message_item("system", system), message_item("user", prompt)], role)
        state.user_simulator.model_calls += 1
        return read_turn(await self.call_model(state, body), lenient=False).text

    async def _passes(self, state: EpisodeState, candidate: str) -> bool:
        """Whether the check accepts the candidate; an unreadable verdict accepts it (a format fallback)."""
        state.user_simulator.checks += 1
        verdict = strategies.check_verdict(await self._review(state, candidate, "user_check"))
        if verdict is None:
            state.user_simulator.format_fallbacks += 1
            return True
        state.user_simulator.failed_checks += not verdict
        return verdict

    async def _verified(self, state: EpisodeState, turn: Turn) -> Turn:
        """tau-bench's verify user: regenerate a rejected message, up to ``max_checks`` candidates."""
        for attempt in range(1, self.settings.user_strategy.max_checks + 1):
            if await self._passes(state, turn.text) or attempt == self.settings.user_strategy.max_checks:
                return turn
            regenerated = await self._generate(state, attempt)
            if regenerated is None:
                return turn
            if regenerated.calls:
                return regenerated
            turn = regenerated
        return turn

    async def _reflected(self, state: EpisodeState, draft: Turn) -> Turn:
        """Reflect on a rejected message and rewrite it, up to ``max_checks`` checks; else keep the draft."""
        candidate = draft.text
        for check in range(1, self.settings.user_strategy.max_checks + 1):
            if await self._passes(state, candidate):
                return Turn(draft.items, candidate, [], draft.truncated)
            if check == self.settings.user_strategy.max_checks:
                break
            state.user_simulator.reflections += 1
            rewritten = strategies.rewritten_message(await self._review(state, candidate, "user_reflect"))
            if rewritten is None:
                state.user_simulator.format_fallbacks += 1
                break
            candidate = rewritten
        return draft
