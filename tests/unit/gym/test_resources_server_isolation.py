"""64 concurrent sessions of one task, tool calls interleaved, each verified on its own."""

import asyncio

import aiohttp

from nemo_tau2.gym.resources_server.bodies import verify_body
from nemo_tau2.tau2_env import domains

TASK_ID = "14"  # airline: cancel_reservation then book_reservation (both write); communicates 327, 1000, 44
SESSIONS = 64


async def _episode(base_url: str, index: int, gate: asyncio.Barrier) -> tuple[int, list[str], dict]:
    task = domains.get_task("airline", TASK_ID)
    actions = task.evaluation_criteria.actions
    # Even sessions play every gold action; odd ones stop after the first (a different final DB).
    plan = actions if index % 2 == 0 else actions[:1]
    errors = []
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(f"{base_url}/seed_session", json={"domain": "airline", "task_id": TASK_ID}) as r:
            assert r.status == 200, await r.text()
        await gate.wait()  # every session is seeded before anyone calls a tool
        for action in plan:
            async with http.post(f"{base_url}/{action.name}", json=action.arguments) as r:
                assert r.status == 200
                if r.headers["X-Tau2-Tool-Error"] == "1":
                    errors.append(await r.text())
            await asyncio.sleep(0)  # let the other sessions' calls in between
        body = verify_body([" ".join(task.evaluation_criteria.communicate_info)])
        async with http.post(f"{base_url}/verify", json=body) as r:
            assert r.status == 200, await r.text()
            return index, errors, await r.json()


async def _run(base_url: str):
    gate = asyncio.Barrier(SESSIONS)
    return await asyncio.gather(*(_episode(base_url, i, gate) for i in range(SESSIONS)))


def test_concurrent_sessions_of_the_same_task_are_isolated(resources_server_url):
    results = asyncio.run(_run(resources_server_url))
    for index, errors, verified in results:
        # Shared state would make the second cancel of the same reservation fail, or double-book seats.
        assert errors == [], (index, errors)
        assert verified["num_tool_calls"] == (2 if index % 2 == 0 else 1)
        assert verified["reward"] == (1.0 if index % 2 == 0 else 0.0), index
        assert verified["db_match"] is (index % 2 == 0)
