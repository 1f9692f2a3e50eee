"""Replica routing on its own: sticky sessions, balance across sessions, routing around a replica that is gone."""

from nemo_tau2.gym.model_server.routing import ReplicaRouter

URLS = ["http://a/v1", "http://b/v1", "http://c/v1"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_call_of_a_session_goes_to_the_replica_it_started_on():
    router = ReplicaRouter(URLS)
    first = {session: router.route(session) for session in ("e1", "e2", "e3")}
    for _ in range(5):
        for session, url in first.items():
            assert router.route(session) == url


def test_new_sessions_go_to_the_replica_with_fewest_calls_in_flight_then_fewest_sessions():
    router = ReplicaRouter(URLS)
    assert [router.route(f"e{i}") for i in range(6)] == URLS + URLS  # balanced by session count
    with router.call("e0"), router.call("e0"), router.call("e1"):  # two calls in flight on a, one on b
        assert router.route("new1") == "http://c/v1"
        assert router.route("new2") == "http://c/v1"  # c has more sessions now, but nothing in flight
    assert router.sessions_on("http://c/v1") == 4


def test_an_unreachable_replica_loses_its_sessions_until_it_is_retried():
    clock = Clock()
    router = ReplicaRouter(URLS[:2], retry_after_s=30, clock=clock)
    pinned = router.route("e1")
    other = next(url for url in URLS[:2] if url != pinned)
    router.unreachable(pinned)
    assert router.route("e1") == other and router.moved_sessions == 1
    assert all(router.route(f"n{i}") == other for i in range(3))  # no new session goes to the gone replica
    clock.now = 31
    assert router.route("e1") == other  # moved sessions stay where they went (their cache is there now)
    assert router.route("late") == pinned  # but the replica takes new sessions again


def test_with_every_replica_unreachable_calls_still_go_somewhere():
    router = ReplicaRouter(URLS[:2])
    for url in URLS[:2]:
        router.unreachable(url)
    assert router.route("e1") in URLS[:2]


def test_round_robin_spreads_one_sessions_calls_over_the_replicas():
    router = ReplicaRouter(URLS, routing="round_robin")
    assert [router.route("e1") for _ in range(4)] == [*URLS, URLS[0]]


def test_the_session_table_is_bounded_and_forgets_the_least_recently_used():
    router = ReplicaRouter(URLS[:2], max_sessions=2)
    for session in ("e1", "e2", "e3"):
        router.route(session)
    assert sum(router.sessions_on(url) for url in URLS[:2]) == 2
