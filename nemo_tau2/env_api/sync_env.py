"""``Tau2Env``: the same environment as :class:`AsyncTau2Env` behind Gymnasium's synchronous ``reset``/``step``.

Each call runs the async environment on one event loop in a background thread shared by every ``Tau2Env`` of the
process, so it works from plain scripts, notebooks (which already run a loop) and worker threads alike.
"""

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import gymnasium

from nemo_tau2.env_api.async_env import AsyncTau2Env
from nemo_tau2.env_api.messages import ChatTurnSpace

_loop_guard = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _loop_guard:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="nemo-tau2-env-loop", daemon=True).start()
        return _loop


def _run[T](coroutine: Coroutine[Any, Any, T]) -> T:
    future = asyncio.run_coroutine_threadsafe(coroutine, _background_loop())
    try:
        return future.result()
    except BaseException:
        future.cancel()  # Ctrl-C: do not leave the step running on the loop
        raise


class Tau2Env(gymnasium.Env):
    """tau2 episodes step by step, Gymnasium-style. Arguments: those of :class:`AsyncTau2Env`.

    >>> env = Tau2Env("airline", split="test", user={"backend": "openai", "temperature": 0.0, ...})
    >>> observation, info = env.reset(task_index=0)
    >>> observation, reward, terminated, truncated, info = env.step({"role": "assistant", "content": "Hi!"})
    """

    metadata = {"render_modes": []}

    def __init__(self, domain: str, **kwargs: Any):
        self.env = AsyncTau2Env(domain, **kwargs)
        self.action_space = ChatTurnSpace("action")
        self.observation_space = ChatTurnSpace("observation")

    @property
    def np_random(self):
        return self.env.np_random

    @np_random.setter
    def np_random(self, value) -> None:
        self.env.np_random = value

    @property
    def config(self):
        return self.env.config

    @property
    def task_ids(self) -> list[str]:
        return self.env.task_ids

    @property
    def messages(self) -> list[dict]:
        return self.env.messages

    def reset(
        self, task_index: int | None = None, sample_index: int = 0, *, seed: int | None = None, options=None
    ) -> tuple[dict, dict]:
        return _run(self.env.reset(task_index, sample_index, seed=seed, options=options))

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        return _run(self.env.step(action))

    def fork(self, n: int) -> list["Tau2Env"]:
        """``n`` independent environments in this one's state (:meth:`AsyncTau2Env.fork`; close this one last)."""
        forks = []
        for env in _run(self.env.fork(n)):
            fork = object.__new__(Tau2Env)
            fork.env, fork.action_space, fork.observation_space = env, self.action_space, self.observation_space
            forks.append(fork)
        return forks

    def close(self) -> None:
        _run(self.env.close())
