"""NeMo-Gym-style sanity tests of the tau2 resources server (run by `gym env test` and by the project's CI).

The project's own, more thorough tests (parity with tau2 on every task over real HTTP, isolation, bad input) live in
tests/unit/gym/.
"""

import json
from pathlib import Path
from unittest.mock import MagicMock

from fastapi.testclient import TestClient
from nemo_gym.server_utils import ServerClient

from nemo_tau2.gym.resources_server.app import Tau2ResourcesServer, Tau2ResourcesServerConfig
from nemo_tau2.gym.resources_server.bodies import verify_body

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def _client() -> TestClient:
    config = Tau2ResourcesServerConfig(
        host="127.0.0.1", port=8080, entrypoint="", name="tau2_resources_server", domains=["airline"]
    )
    server = Tau2ResourcesServer(config=config, server_client=MagicMock(spec=ServerClient))
    return TestClient(server.setup_webserver())


class TestApp:
    def test_sanity(self) -> None:
        client = _client()
        assert client.post("/seed_session", json={"domain": "airline", "task_id": "11"}).status_code == 200

    def test_verify_rewards_the_gold_actions_and_not_doing_nothing(self) -> None:
        client = _client()
        client.post("/seed_session", json={"domain": "airline", "task_id": "11"})
        response = client.post(
            "/update_reservation_flights",
            json={
                "reservation_id": "GV1N64",
                "cabin": "basic_economy",
                "payment_id": "gift_card_1642017",
                "flights": [
                    {"flight_number": "HAT003", "date": "2024-05-19"},
                    {"flight_number": "HAT290", "date": "2024-05-20"},
                ],
            },
        )
        assert response.headers["X-Tau2-Tool-Error"] == "0", response.text
        assert client.post("/verify", json=verify_body(["The refund is 5244."])).json()["reward"] == 1.0

        client.post("/seed_session", json={"domain": "airline", "task_id": "11"})
        assert client.post("/verify", json=verify_body([])).json()["reward"] == 0.0

    def test_example_rows_seed(self) -> None:
        client = _client()
        rows = [json.loads(line) for line in (DATA_DIR / "example.jsonl").read_text().splitlines()]
        assert len(rows) == 5
        for row in rows:
            assert client.post("/seed_session", json=row).status_code == 200
