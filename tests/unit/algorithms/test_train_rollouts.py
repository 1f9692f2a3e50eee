"""The causes of failed training episodes, counted by what they mean, and the step files a resumed run supersedes."""

import asyncio
import json
from collections import Counter

import pytest
from aiohttp import web

from nemo_tau2.algorithms.train_rollouts import TrainRolloutLog, failure_causes, set_aside_steps_after
from nemo_tau2.evals.results import describe_causes
from nemo_tau2.experience.rollouts import INFRASTRUCTURE_ERROR, OK, RolloutResult, result_from_response
from nemo_tau2.gym.http_client import GymHttpClient, InfrastructureError, RetryConfig
from nemo_tau2.gym.launch import free_port

NO_RETRY = RetryConfig(max_attempts=2, backoff_s=0, timeout_s=5)
STOPPING = "the server stopped before it answered (it is shutting down); retry elsewhere"


async def _failures() -> list[InfrastructureError]:
    """A tool call to two ports where nothing listens, and to two servers of ours answering 502 with a detail that
    names where and a cause that does not (as our model servers do)."""
    app = web.Application()

    async def failing(request: web.Request) -> web.Response:
        where = f"http://{request.host}/v1"
        body = {
            "detail": f"policy_model: endpoint {where} answered 500",
            "cause": "policy_model: endpoint answered 500",
        }
        return web.json_response(body, status=502)

    app.router.add_post("/tool", failing)
    runner = web.AppRunner(app)
    await runner.setup()
    ports = [free_port(), free_port()]
    for port in ports:
        await web.TCPSite(runner, "127.0.0.1", port).start()
    client, raised = GymHttpClient(), []
    try:
        for url in [
            *(f"http://127.0.0.1:{free_port()}/tool" for _ in range(2)),
            *(f"http://127.0.0.1:{p}/tool" for p in ports),
        ]:
            with pytest.raises(InfrastructureError) as e:
                await client.post(url, {}, NO_RETRY, what="tool call create_task")
            raised.append(e.value)
    finally:
        await client.close()
        await runner.cleanup()
    return raised


def test_one_failure_at_several_addresses_is_one_cause_and_each_error_keeps_where():
    """What differs between episodes of one failure (the address) stays in the error and never reaches the cause,
    which the failing side writes apart: nothing rewrites words to find it."""
    refused_a, refused_b, failing_a, failing_b = asyncio.run(_failures())
    assert (
        refused_a.cause
        == refused_b.cause
        == ("tool call create_task failed after 2 attempts: ClientConnectorError: Connection refused")
    )
    assert (
        failing_a.cause
        == failing_b.cause
        == ("tool call create_task failed after 2 attempts: HTTP 502: policy_model: endpoint answered 500")
    )
    for e in (refused_a, failing_a):
        assert str(e).startswith(e.cause + " (http://127.0.0.1:") and str(e) != str(refused_b)
    # the agent's 502 carries both; the head's record keeps both, and counting counts the cause
    results = [
        result_from_response(
            {}, i, i, 0, 502, {"error": str(e), "cause": e.cause, "status": "infrastructure_error"}, False
        )
        for i, e in enumerate([refused_a, refused_b, failing_a, failing_b, refused_a])
    ]
    results.append(result_from_response({}, 5, 5, 0, 503, {"detail": STOPPING}, False))  # request_guard's answer
    assert results[0].error == f"agent /run HTTP 502: {refused_a}" and "127.0.0.1" not in results[0].cause
    causes = failure_causes(results)
    assert causes == Counter({
        f"agent /run HTTP 502: {refused_a.cause}": 3, f"agent /run HTTP 502: {failing_a.cause}": 2,
        f"agent /run HTTP 503: {STOPPING}": 1,
    })  # fmt: skip
    line = describe_causes(causes | Counter({"x": 1, "y": 1}), top=2)
    assert line == (
        f"3x agent /run HTTP 502: {refused_a.cause}; 2x agent /run HTTP 502: {failing_a.cause}; 3 more cause(s)"
    )


def _result(step_index: int, ok: bool) -> RolloutResult:
    status, error = (OK, None) if ok else (INFRASTRUCTURE_ERROR, "agent /run HTTP 502: lost")
    return RolloutResult(step_index, 0, step_index, "mock", "t", status, error=error, reward=1.0 if ok else None)


def test_failed_episodes_are_written_per_step_and_a_resume_supersedes_the_steps_after_its_checkpoint(tmp_path):
    log = TrainRolloutLog(tmp_path, "failed", start_step=0)
    for step in (1, 2, 3):
        log.write(step, [_result(0, ok=True), _result(1, ok=False)])
    log.close()
    (tmp_path / "validation" / "step_3").mkdir(parents=True)
    (tmp_path / "validation" / "step_3" / "rollouts.jsonl").write_text("{}\n")
    lines = (tmp_path / "train" / "step_2" / "rollouts.jsonl").read_text().splitlines()
    assert [json.loads(line)["error"] for line in lines] == ["agent /run HTTP 502: lost"]  # the failed one only

    resumed = TrainRolloutLog(tmp_path, "all", start_step=1)  # resumed from step 1's checkpoint
    resumed.write(2, [_result(0, ok=True)])
    resumed.close()
    assert (tmp_path / "train" / "step_1" / "rollouts.jsonl").exists()  # trained before the checkpoint: kept
    for folder in ("train/step_2", "train/step_3", "validation/step_3"):
        assert (tmp_path / folder / "rollouts.jsonl.superseded-1").exists(), folder
    assert len((tmp_path / "train" / "step_2" / "rollouts.jsonl").read_text().splitlines()) == 1
    assert not (tmp_path / "train" / "step_3" / "rollouts.jsonl").exists()
    assert set_aside_steps_after(tmp_path / "train", 1) == [tmp_path / "train/step_2/rollouts.jsonl.superseded-2"]
