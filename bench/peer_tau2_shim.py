"""What NeMo-Gym 0.7.0's own tau2 agent needs of tau2 and stock tau2 v1.0.1 lacks, added to a copy of the release.

Their agent (``responses_api_agents/tau2/app.py``) is written against a fork of tau2
(``bxyu-nvidia/tau2-bench@bxyu/nemo_gym_stable``, pinned by git URL in its requirements, unreachable offline). On
stock v1.0.1 every ``/run`` fails with ``ValueError: "TextRunConfig" object has no field "max_agent_steps"``. Three
additions make it run, and nothing else changes:

1. ``TextRunConfig`` accepts ``max_agent_steps`` and ``turns_remaining_interval`` (their agent assigns them; they
   are not enforced here: the oracle ends long before any limit).
2. ``SimulationRun`` has ``agent_messages``, ``agent_steps`` and ``max_agent_steps`` (their agent reads them; None).
3. ``tau2.runner.batch.run_single_task`` can be awaited (their agent awaits it; the fork's is async): v1.0.1's
   synchronous function runs in a worker thread of the event loop's default executor.

Applied to a git branch of a local copy (:func:`apply_shim`), which their agent installs and clones its data from.
"""

from pathlib import Path

SHIM_REVISION = "1"  # bump when the edits change: cached installs are rebuilt

_CONFIG_ANCHOR = '''    user simulator, with an Orchestrator managing the conversation.
    """
'''
_CONFIG_FIELDS = """
    # NeMo-Gym 0.7.0's tau2 agent assigns these (its fork's fields): accepted, not enforced
    max_agent_steps: Optional[int] = None
    turns_remaining_interval: int = 1
"""
_RUN_ANCHOR = '''    Simulation run for the given task.
    """
'''
_RUN_FIELDS = """
    # NeMo-Gym 0.7.0's tau2 agent reads these (its fork's fields): always None here
    agent_messages: Optional[list] = None
    agent_steps: Optional[int] = None
    max_agent_steps: Optional[int] = None
"""
_SYNC_CALL = "            return run_single_task(\n"
_AWAITABLE = """

# NeMo-Gym 0.7.0's tau2 agent awaits run_single_task (its fork's is async): v1.0.1's runs in a worker thread.
_run_single_task_sync = run_single_task


async def run_single_task(*args, **kwargs):  # noqa: F811
    import asyncio

    return await asyncio.to_thread(_run_single_task_sync, *args, **kwargs)
"""


def _insert_after(text: str, anchor: str, addition: str, where: Path) -> str:
    if text.count(anchor) != 1:
        raise RuntimeError(f"{where}: expected one {anchor.strip()[:40]!r}; is this tau2 v1.0.1?")
    return text.replace(anchor, anchor + addition)


def apply_shim(repo: Path) -> None:
    """Edit ``repo`` (a copy of tau2 v1.0.1's source) in place."""
    simulation = repo / "src/tau2/data_model/simulation.py"
    text = _insert_after(simulation.read_text(), _CONFIG_ANCHOR, _CONFIG_FIELDS, simulation)
    simulation.write_text(_insert_after(text, _RUN_ANCHOR, _RUN_FIELDS, simulation))
    batch = repo / "src/tau2/runner/batch.py"
    text = batch.read_text()
    if text.count(_SYNC_CALL) != 1:
        raise RuntimeError(f"{batch}: expected one synchronous run_single_task call; is this tau2 v1.0.1?")
    batch.write_text(text.replace(_SYNC_CALL, "            return _run_single_task_sync(\n") + _AWAITABLE)
