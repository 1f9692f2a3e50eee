"""The fake as a subprocess (``python -m nemo_tau2.testing.fake_server``), driven over its HTTP control route."""

import json
import subprocess
import sys
import urllib.request

import pytest
from conftest import chat

from nemo_tau2.testing import FakeServerConfig, ScriptSpec, Turn, TurnSpec, connect_fake_server, start_fake_server
from nemo_tau2.testing.fake_server import READY_LINE_PREFIX, main

MESSAGES = [{"role": "user", "content": "hi"}]


async def test_subprocess_server_is_driven_over_http(http):
    config = FakeServerConfig(scripts={"preset": ScriptSpec(turns=[TurnSpec(text="from config")])})
    fake = start_fake_server(config, mode="subprocess")
    try:
        assert fake.base_url.startswith("http://127.0.0.1:") and fake.base_url.endswith("/v1")
        data = await chat(http, fake, messages=MESSAGES, user="preset")
        assert data["choices"][0]["message"]["content"] == "from config"
        fake.register_script("k", [Turn.call("get_user", {"user_id": "u1"})])
        fake.inject_fault("http_503", key="k")
        async with http.post(f"{fake.base_url}/chat/completions", json={"messages": MESSAGES, "user": "k"}) as r:
            assert r.status == 503
        data = await chat(http, fake, messages=MESSAGES, user="k")
        assert data["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_user"
        remote = connect_fake_server(fake.base_url)  # a second handle, as another process would hold
        stats = remote.stats()
        assert stats.requests_by_key == {"preset": 1, "k": 2} and stats.faults_by_kind == {"http_503": 1}
        assert stats.responses_by_status[503] == 1
    finally:
        fake.close()
    with pytest.raises(OSError):  # the process is gone
        connect_fake_server(fake.base_url).stats()


def test_remote_control_errors_name_the_problem():
    with start_fake_server(mode="subprocess", tau2=None) as fake, pytest.raises(ValueError, match="are disabled"):
        fake.set_tau2_scripts()


def test_cli_reads_a_yaml_config(tmp_path):
    config_path = tmp_path / "fake.yaml"
    config_path.write_text("model: yaml-model\nlatency_ms: 0\n")
    command = [sys.executable, "-m", "nemo_tau2.testing.fake_server", "--config", str(config_path), "--port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith(READY_LINE_PREFIX)
        with urllib.request.urlopen(f"{line.removeprefix(READY_LINE_PREFIX).strip()}/models", timeout=10) as r:
            assert json.loads(r.read())["data"][0]["id"] == "yaml-model"
    finally:
        process.terminate()
        assert process.wait(timeout=15) == 0


def test_cli_rejects_two_configs():
    with pytest.raises(SystemExit):
        main(["--config", "a.yaml", "--config-json", "{}"])


def test_subprocess_mode_refuses_python_objects():
    with pytest.raises(ValueError, match="cannot cross into a subprocess"):
        start_fake_server(mode="subprocess", scripts={"k": object()})
