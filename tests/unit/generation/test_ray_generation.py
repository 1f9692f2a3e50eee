"""The policy's generation replicas as Ray-placed processes on a multi-node cluster.

One ``ray.cluster_utils.Cluster`` for the module: a head and a worker that stand for CPU nodes (they offer
``gym_cpu``, where the Gym servers go) and two workers that stand for GPU nodes (a ``fake_gpu`` resource each).
Generation replicas are the scripted fake engine's servers; everything else is real: Ray's placement, the Gym
servers, tau2, HTTP between nodes' addresses. What the servers count (``/fake/stats``) and log is the evidence.
(vLLM's CPU build as a Ray-placed replica: ``tests/unit/algorithms/test_grpo_vllm.py``.)
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests
from ray.cluster_utils import Cluster

from nemo_tau2.cluster import ClusterConfig, import_ray
from nemo_tau2.config import ConfigError, apply_overrides, load_config
from nemo_tau2.evals.eval import setup_eval
from nemo_tau2.experience.rollouts import OK, SamplingParams, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig, start_generation
from nemo_tau2.generation.errors import GenerationStartupError, WeightUpdateError
from nemo_tau2.generation.ray_replicas import HEALTH_MISSES, RayGeneration
from nemo_tau2.generation.replica_logs import head_log_name, read_log_tails
from nemo_tau2.generation.tiny_model import build_tiny_model
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.tau2_env.gym_rows import task_row

GPU, GYM = "fake_gpu", "gym_cpu"
ROOT = Path(__file__).parents[3]
EVAL_FAKE = ROOT / "examples" / "configs" / "evals" / "tau2_fake.yaml"
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=512)
FAKE = GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0)


@pytest.fixture(scope="module")
def cluster():
    ray = import_ray()
    small = {"object_store_memory": 80 * 1024**2}
    cluster = Cluster(  # not connected: runs join it through cluster.ray_address, as on a real cluster
        initialize_head=True, connect=False, head_node_args={"num_cpus": 4, "resources": {GYM: 4}, **small}
    )
    gpu_nodes = [cluster.add_node(num_cpus=2, resources={GPU: 2}, **small) for _ in range(2)]
    cpu_node = cluster.add_node(num_cpus=2, resources={GYM: 2}, **small)
    cluster.wait_for_nodes()
    yield cluster, gpu_nodes, cpu_node
    ray.shutdown()
    for node in [*cluster.worker_nodes, cluster.head_node]:
        cluster.remove_node(node, allow_graceful=False)
    cluster.shutdown()


def _placement(cluster, **fields) -> ClusterConfig:
    return ClusterConfig(
        **{"ray_address": cluster[0].address, "generation_placement": "ray", "generation_node_resource": GPU} | fields
    )


def _server_pid(base_url: str) -> int:
    """The pid listening on a replica's port (all nodes of a local cluster are this machine)."""
    port = int(base_url.removesuffix("/v1").rsplit(":", 1)[1])
    return next(c.pid for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port)


def _faults(server_url: str) -> int:
    return sum(requests.get(server_url + "/fake/stats", timeout=10).json()["faults_by_kind"].values())


def _chat_requests(base_url: str) -> int:
    stats = requests.get(base_url.removesuffix("/v1") + "/fake/stats", timeout=10).json()
    return stats["requests_by_route"].get("chat", 0)


def _rows(domain: str, tasks: list[str], sample: int) -> list[dict]:
    return [task_row(domain, task) | {"sample_index": sample} for task in tasks]


def test_placement_keys_are_checked_with_a_one_line_fix():
    def eval_config(*overrides: str):
        return setup_eval(apply_overrides(load_config(EVAL_FAKE), list(overrides)))

    with pytest.raises(ConfigError, match=r"set cluster.generation_placement=ray"):
        eval_config("cluster.generation_replicas=2")
    with pytest.raises(ConfigError, match=r"backend 'openai' starts none"):
        eval_config("cluster.generation_placement=ray", "policy.generation.backend=openai",
                    "+policy.generation.openai_cfg={base_url: 'http://127.0.0.1:9/v1', model: m}")  # fmt: skip
    with pytest.raises(ConfigError, match=r"cluster.generation_node_resource: .*custom resource name"):
        eval_config("cluster.generation_node_resource=GPU")
    cfg = eval_config("cluster.generation_placement=ray", "cluster.generation_replicas=2",
                      "cluster.generation_node_resource=generation")  # fmt: skip
    assert (cfg.cluster.generation_replicas, cfg.cluster.generation_node_resource) == (2, "generation")


def test_replicas_the_cluster_cannot_hold_are_refused_at_once(cluster):
    began = time.monotonic()
    with pytest.raises(GenerationStartupError, match=r"cannot hold 3 generation replicas .* add GPU nodes"):
        start_generation(FAKE, cluster=_placement(cluster, generation_replicas=3, generation_node_resource="x"))
    assert time.monotonic() - began < 60


def test_replicas_land_on_the_gpu_nodes_serve_episodes_and_a_lost_one_is_restarted_then_dropped(cluster, tmp_path):
    """Two fake replicas on the two "GPU" nodes, the Gym servers on the head; episodes spread over both replicas.
    A replica whose server dies is restarted once at its URL; killed again, it is dropped, and the episodes
    running meanwhile all finish with their reward: a lost replica costs turns a retry, never a score. Each
    replica's log comes back from its node to the run's log folder: a lost one's at once, the others' at the end."""
    gpu_nodes = cluster[1]
    spec = Tau2EnvironmentSpec(
        policy=FAKE,
        user=None,
        domains=["airline"],
        gym=NemoGymEnvConfig(),
        log_dir=tmp_path,
        cluster=_placement(
            cluster, generation_replicas=2, generation_replica_restarts=1, gym_placement="ray", gym_node_resource=GYM
        ),  # fmt: skip
    )
    with Tau2Environment(spec) as env:
        replicas = env.policy.replicas
        assert {r["node_id"] for r in replicas.replicas} == {node.node_id for node in gpu_nodes}  # SPREAD
        gym_nodes = {node["node_id"] for node in env.servers.placement.values()}
        assert gym_nodes and not gym_nodes & {node.node_id for node in gpu_nodes}
        assert env.policy.base_urls == [r["base_url"] for r in replicas.replicas]
        node_log_dirs = [r["log_dir"] for r in replicas.replicas]
        assert all(os.path.isdir(folder) for folder in node_log_dirs) and not list(tmp_path.glob("fake_replica*"))
        results = run_nemo_gym_rollout_sync(_rows("airline", ["0", "1", "2", "3"], 0), env.agent_urls, SAMPLING, 1)
        assert [r.status for r in results] == [OK] * 4 and all(r.reward == 1.0 for r in results)
        assert all(_chat_requests(url) > 0 for url in env.policy.base_urls)  # both replicas served turns

        # Two probes in a row unanswered (a busy machine) lose no replica; the next answer clears them. The faults
        # go in just after an answered probe, so that a slow answer the busy box gave before cannot make a third.
        busy = env.policy.base_urls[0].removesuffix("/v1")
        probes, deadline = replicas.replicas[0].get("probes", 0), time.monotonic() + 30
        while replicas.replicas[0].get("probes", 0) == probes or replicas.replicas[0]["slow_probes"]:
            assert time.monotonic() < deadline and not replicas.lost, replicas.lost
            time.sleep(0.05)
        fault = {"kind": "timeout", "route": "health", "count": HEALTH_MISSES - 1, "hold_s": 7}
        requests.post(f"{busy}/fake/control", json={"faults": [fault]}, timeout=10).raise_for_status()
        deadline = time.monotonic() + 90
        while replicas.replicas[0]["slow_probes"] != 0 or _faults(busy) < HEALTH_MISSES - 1:
            assert time.monotonic() < deadline and not replicas.lost, replicas.lost
            time.sleep(0.2)
        assert not replicas.lost and env.policy.base_urls == [r["base_url"] for r in replicas.replicas]

        lost_url = env.policy.base_urls[1]
        rows, results = _rows("airline", [str(i) for i in range(8)], 1), []
        for url in env.policy.base_urls:  # turns slow enough for a replica to die under running episodes
            requests.post(url.removesuffix("/v1") + "/fake/control", json={"latency_ms": 150}, timeout=10)
        run = threading.Thread(
            target=lambda: results.extend(
                run_nemo_gym_rollout_sync(rows, env.agent_urls, SAMPLING, 1, max_concurrency=4)
            )
        )
        run.start()
        deadline = time.monotonic() + 60
        while _chat_requests(lost_url) < 3:
            assert time.monotonic() < deadline, "no turn reached the replica to lose"
            time.sleep(0.1)
        os.kill(_server_pid(lost_url), signal.SIGKILL)
        deadline = time.monotonic() + 120
        while len(replicas.lost) < 1 or replicas.replicas[1] is None or not replicas.replicas[1]["restarts"]:
            assert time.monotonic() < deadline, "the lost replica was not restarted"
            time.sleep(0.2)
        assert env.policy.base_urls == [r["base_url"] for r in replicas.replicas]  # restarted at its URL
        assert requests.get(lost_url.removesuffix("/v1") + "/health", timeout=10).ok
        serving = f"serving at {lost_url}\n"
        assert (tmp_path / "fake_replica1.log").read_text().count(serving) == 1  # the lost server's, from its node
        assert not os.path.exists(node_log_dirs[1])
        requests.post(lost_url.removesuffix("/v1") + "/fake/control", json={"latency_ms": 150}, timeout=10)
        os.kill(_server_pid(lost_url), signal.SIGKILL)  # its one restart is used: dropped
        deadline = time.monotonic() + 60
        while env.policy.base_urls != [replicas.replicas[0]["base_url"]]:
            assert time.monotonic() < deadline, "the twice-lost replica was not dropped"
            time.sleep(0.2)
        run.join(timeout=300)
        assert not run.is_alive() and len(results) == 8
        assert [r.status for r in results] == [OK] * 8 and all(r.reward == 1.0 for r in results)
        assert len(replicas.lost) == 2 and replicas.replicas[1] is None
        kept_url = env.policy.base_urls[0]
    assert (tmp_path / "fake_replica1.log").read_text().count(serving) == 2  # both servers lost, each log kept
    assert (tmp_path / "fake_replica0.log").read_text().count(f"serving at {kept_url}\n") == 1  # at the run's end
    assert not [folder for folder in node_log_dirs if os.path.exists(folder)]


def test_a_replicas_log_comes_back_bounded_from_its_line_start_and_its_node_folder_is_removed(tmp_path):
    folder = tmp_path / "node"
    folder.mkdir()
    lines = [f"line {i:04d}\n" for i in range(1000)]  # 10 bytes each
    (folder / "vllm_replica0.log").write_text("".join(lines))
    (tail,) = read_log_tails(str(folder), max_bytes=95).values()
    assert tail.decode().splitlines() == [
        f"[nemo-tau2: the first {10 * 991} bytes of {folder / 'vllm_replica0.log'} are left out]",
        *[line.strip() for line in lines[991:]],
    ]
    assert not folder.exists()
    assert (head_log_name("vllm_replica0.log", 3), head_log_name("server.log", 1)) == (
        "vllm_replica3.log", "replica1_server.log",
    )  # fmt: skip


HEAD_RUN = """
import json, sys, time
from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.generation import GenerationConfig, start_generation

cfg = GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0)
cluster = ClusterConfig(ray_address=sys.argv[1], generation_placement="ray", generation_node_resource="fake_gpu")
handle = start_generation(cfg, cluster=cluster)
print("SERVING", json.dumps(handle.base_urls), flush=True)
while True:
    time.sleep(1)
"""


def test_a_head_process_killed_leaves_no_replica_serving(cluster):
    head = subprocess.Popen([sys.executable, "-c", HEAD_RUN, cluster[0].address], stdout=subprocess.PIPE, text=True)
    try:
        lines = iter(head.stdout.readline, "")
        urls = json.loads(next((line for line in lines if line.startswith("SERVING ")), " []").split(" ", 1)[1])
        assert urls, "the head process did not start its replica"
        pid = _server_pid(urls[0])
        head.kill()  # no cleanup of its own: Ray ends the dead driver's actors, their servers die with them
        head.wait(timeout=30)
    finally:
        head.kill()
    deadline = time.monotonic() + 60
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the replica's server outlived the head process"
        time.sleep(0.2)
    with pytest.raises(requests.ConnectionError):
        requests.get(urls[0].removesuffix("/v1") + "/health", timeout=5)


def test_a_replica_whose_lease_is_not_renewed_ends_itself_and_its_server(cluster):
    """The head alive, Ray fine, only the renewals gone (as for a node cut off from the head): the replica's actor
    and its server end themselves once the lease runs out, not before."""
    lease_s = 5.0  # at least the Gym watcher's detection time: 1 x (1 + 1) s here
    fast = {"gym_health_interval_s": 1.0, "gym_health_timeout_s": 1.0, "gym_health_failures": 1}
    cluster_config = _placement(cluster, lease_timeout_s=lease_s, **fast)
    replicas = RayGeneration(FAKE, cluster_config, start_replica=start_generation)
    replicas.start()
    try:
        (replica,) = replicas.replicas
        server, actor = _server_pid(replica["base_url"]), replica["pid"]
        time.sleep(lease_s / 2)
        assert requests.get(replica["base_url"].removesuffix("/v1") + "/health", timeout=5).ok  # renewed
        replicas._renewer.stop()
        stopped = time.monotonic()
        while any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                  for pid in (server, actor)):  # fmt: skip
            # generous: on a loaded box a process takes seconds to end (the one-box lease test's fork server: 5-15 s)
            assert time.monotonic() - stopped < lease_s + 60, "the replica outlived its lease"
            time.sleep(0.2)
        ended = time.monotonic() - stopped
        print(f"replica ended {ended:.1f} s after the last renewal (lease {lease_s:g} s)")
        assert ended > lease_s - 2 * lease_s / 6  # the last renewal at most a sixth of the lease before the stop
    finally:
        replicas.stop()


def test_an_eval_on_the_cluster_survives_a_gym_node_lost_mid_run(cluster, tmp_path):
    """``run_eval.py`` as a user runs it against the cluster: the policy's replicas on the "GPU" nodes (its log
    says where), two agent and two resources replicas over the CPU nodes. The CPU worker is removed (a crash) once
    episodes are saved: the episodes it held are infrastructure errors, every other ends with its reward, the results
    file holds one line per episode, and nothing is scored because of the fault."""
    ray_cluster, gpu_nodes, cpu_node = cluster
    save = tmp_path / "results"
    command = [
        sys.executable, str(ROOT / "examples" / "run_eval.py"), "--config", str(EVAL_FAKE),
        f"eval.save_path={save}", "data.domains=[airline]", "data.num_tasks=8", "eval.num_tests_per_prompt=2",
        "eval.k_values=[1,2]", "eval.bootstrap_samples=0", "eval.max_concurrency=4",
        # episodes long enough to be cut: at 100 ms a loaded box once finished all 16 (3 s) before the removal took
        "policy.generation.fake_cfg={latency_ms: 300}",
        f"cluster.ray_address={ray_cluster.address}", "cluster.generation_placement=ray",
        f"cluster.generation_node_resource={GPU}", "cluster.generation_replicas=2",
        "cluster.gym_placement=ray", f"cluster.gym_node_resource={GYM}",
        "env.nemo_gym.agent_replicas=2", "env.nemo_gym.resources_replicas=2",
    ]  # fmt: skip
    rollouts = save / "rollouts.jsonl"
    with open(tmp_path / "stderr.log", "w") as stderr:
        run = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            deadline = time.monotonic() + 240
            while not rollouts.exists() or len(rollouts.read_text().splitlines()) < 2:
                assert run.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.log").read_text()
                time.sleep(0.1)
            ray_cluster.remove_node(cpu_node, allow_graceful=False)
            out, _ = run.communicate(timeout=300)
        finally:
            run.kill()
    log = (tmp_path / "stderr.log").read_text()
    assert run.returncode == 0, log[-3000:]
    placed = re.findall(r"generation replica (\d) on node (\w+) at", log)
    assert sorted(index for index, _ in placed) == ["0", "1"]
    assert {node for _, node in placed} == {node.node_id[:12] for node in gpu_nodes}
    records = [json.loads(line) for line in rollouts.read_text().splitlines()]
    assert len(records) == 16 and len({(r["task_id"], r["sample_index"]) for r in records}) == 16
    failed = [r for r in records if r["status"] != OK]
    assert failed and len(failed) <= 8  # cut mid-episode: at most what the lost node held
    assert all(r["reward"] is None for r in failed)
    # each says why: the agent's node went away (503 from a stopping server, or the connection dropped), not the
    # bare 500 a stopping server's framework sends
    assert all(r["error"] and "Internal Server Error" not in r["error"] for r in failed), failed[0]["error"]
    assert all(r["reward"] == 1.0 for r in records if r["status"] == OK)
    assert f"{len(failed)} episode(s) failed for infrastructure reasons" in out


def _greedy(base_url: str, model: str) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 6,
            "temperature": 0.0, "logprobs": True}  # fmt: skip
    response = requests.post(f"{base_url}/chat/completions", json=body, timeout=60)
    assert response.ok, response.text
    return response.json()


def test_weights_reach_the_replica_on_every_node_and_a_restarted_one_comes_back_with_the_latest(cluster, tmp_path):
    """Two hf replicas (each server lives in its actor), one per "GPU" node, updated to step 3's weights: both
    answer alike, labelled 3. A folder no node can read is refused naming the nodes, and the weights stay. Then a
    replica's process is killed: the watcher restarts it on its bundle, at its URL, and loads the latest weights
    before anything else: it answers as before the kill, labelled 3 (without the reload: the starting weights, 0)."""
    for seed, name in ((0, "base"), (1, "step_3")):
        tiny = build_tiny_model(seed=seed)
        tiny.model.save_pretrained(tmp_path / name)
        tiny.tokenizer.save_pretrained(tmp_path / name)
    cfg = GenerationConfig(backend="hf", model_name=str(tmp_path / "base"), temperature=1.0, top_p=1.0, hf_cfg={})
    placement = _placement(cluster, generation_replicas=2, generation_replica_restarts=1)
    with start_generation(cfg, cluster=placement) as handle:
        replicas = handle.replicas
        assert {r["node_id"] for r in replicas.replicas} == {node.node_id for node in cluster[1]}
        assert [_greedy(url, handle.model_name)["weight_version"] for url in handle.base_urls] == [0, 0]
        assert handle.update_weights(checkpoint_dir=str(tmp_path / "step_3"), weight_version=3) == 3
        before = [_greedy(url, handle.model_name) for url in handle.base_urls]
        assert [answer["weight_version"] for answer in before] == [3, 3]
        assert before[0]["choices"][0]["logprobs"] == before[1]["choices"][0]["logprobs"]
        with pytest.raises(WeightUpdateError, match=r"cannot be read on the generation node.*every node mounts"):
            handle.update_weights(checkpoint_dir=str(tmp_path / "elsewhere"), weight_version=4)
        url = handle.base_urls[1]
        os.kill(_server_pid(url), signal.SIGKILL)
        deadline = time.monotonic() + 120
        while not replicas.lost or replicas.replicas[1] is None or not replicas.replicas[1]["restarts"]:
            assert time.monotonic() < deadline and replicas.replicas[1] is not None, replicas.lost
            time.sleep(0.2)
        after = _greedy(url, handle.model_name)
        assert after["weight_version"] == 3
        assert after["choices"][0]["logprobs"] == before[1]["choices"][0]["logprobs"]


def test_on_one_box_the_run_starts_a_ray_that_holds_every_replica_it_places(tmp_path):
    """No ``cluster.ray_address``: the run starts a Ray of its own sized for what it places (two generation, two
    agent and two resources bundles of one CPU: more than this 2-core box's CPUs), plays episodes, and stops it."""
    ray = import_ray()
    spec = Tau2EnvironmentSpec(
        policy=FAKE,
        user=None,
        domains=["airline"],
        gym=NemoGymEnvConfig(agent_replicas=2, resources_replicas=2),
        log_dir=tmp_path,
        cluster=ClusterConfig(generation_placement="ray", generation_replicas=2, gym_placement="ray"),
    )
    with Tau2Environment(spec) as env:
        assert ray.cluster_resources()["CPU"] >= 6 and len(env.policy.base_urls) == 2
        results = run_nemo_gym_rollout_sync(_rows("airline", ["0", "1"], 0), env.agent_urls, SAMPLING, 1)
        assert [r.status for r in results] == [OK] * 2 and all(r.reward == 1.0 for r in results)
    assert not ray.is_initialized()
