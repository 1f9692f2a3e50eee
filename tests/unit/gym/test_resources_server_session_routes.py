"""NeMo-Gym 0.7.0's resources-server routes, served on either release: ``/close_session`` frees the episode of the
cookie, ``/reverify_mode`` says a stored rollout is re-scored without its session (``stateless``)."""

import requests

from tests.unit.gym.tau2_http import HttpEpisode


def _live_sessions(url: str) -> int:
    return requests.get(f"{url}/session_stats", timeout=30).json()["live_sessions"]


def test_close_session_frees_the_episode_and_later_calls_get_no_session(resources_server_url):
    episode = HttpEpisode(resources_server_url, "airline", "0")
    before = _live_sessions(resources_server_url)
    episode.seed()
    assert _live_sessions(resources_server_url) == before + 1
    closed = episode.session.post(f"{resources_server_url}/close_session", json={}, timeout=30)
    assert closed.status_code == 200 and set(closed.json()) == {"resources_session_id"}
    assert _live_sessions(resources_server_url) == before
    after = episode.session.post(f"{resources_server_url}/get_user_details", json={"user_id": "x"}, timeout=30)
    assert after.status_code == 404, after.text  # no live session: the episode is gone
    again = episode.session.post(f"{resources_server_url}/close_session", json={}, timeout=30)
    assert again.status_code == 200  # closing a closed session succeeds


def test_reverify_mode_is_stateless(resources_server_url):
    answer = requests.get(f"{resources_server_url}/reverify_mode", timeout=30)
    assert (answer.status_code, answer.json()) == (200, "stateless")
