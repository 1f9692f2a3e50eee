"""The Gym servers placed on a multi-node Ray cluster, episodes through their replicas, and a node lost mid-run.

One ``ray.cluster_utils.Cluster`` for the module: a head standing for the generation node (a ``fake_gpu`` resource,
no ``gym_cpu``) and two CPU workers offering ``gym_cpu``. Two agent replicas (each with its model servers) and two
resources replicas run there, the scripted fake engine plays policy and user. What each server says in its own log
(the resources servers' "session seeded", the agents' "episode started", uvicorn's access lines) is the evidence.
Then the cluster breaks as real ones do: a Gym node goes silent (its processes stopped; a spare node joins for its
servers to start again on), then a node is removed.
"""

import asyncio
import contextlib
import json
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import psutil
import pytest
import requests
from ray._private import ray_constants
from ray.cluster_utils import Cluster

from nemo_tau2.algorithms.grpo_config import GRPOMasterConfig
from nemo_tau2.algorithms.loss import NLLLossFn
from nemo_tau2.algorithms.train_rollouts import failure_causes
from nemo_tau2.algorithms.training_setup import open_cluster
from nemo_tau2.cluster import ClusterConfig, import_ray
from nemo_tau2.config import ConfigError, apply_overrides, load_config, validate_config
from nemo_tau2.evals.config import EvalMasterConfig
from nemo_tau2.evals.eval import setup_eval
from nemo_tau2.evals.results import describe_causes
from nemo_tau2.experience.rollouts import OK, SamplingParams, run_async_nemo_gym_rollout, run_nemo_gym_rollout_sync
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.generation.tiny_model import build_tiny_model
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec, run_ray
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.gym.http_client import RetryConfig
from nemo_tau2.gym.launch import ServerSpec, ServerStartError
from nemo_tau2.gym.ray_servers import RayGymServers
from nemo_tau2.gym.stack import (
    AGENT,
    POLICY_MODEL,
    RESOURCES_SERVER,
    RESOURCES_SERVER_CLASS,
    USER_MODEL,
    ServerGroup,
)
from nemo_tau2.models.policy import TrainingSequence
from nemo_tau2.models.policy.lm_policy import Policy
from nemo_tau2.request_guard import RUN_ID_HEADER
from nemo_tau2.tau2_env.gym_rows import task_row
from tests.sigterm import as_from_a_terminal

GYM = "gym_cpu"
GRPO_SMOKE = Path(__file__).parents[3] / "examples" / "configs" / "grpo_tau2_cpu_smoke.yaml"
EVAL_FAKE = Path(__file__).parents[3] / "examples" / "configs" / "evals" / "tau2_fake.yaml"
SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=512)
RESOURCES = [RESOURCES_SERVER, f"{RESOURCES_SERVER}_1"]
AGENTS = [AGENT, f"{AGENT}_1"]
SLOW_IMPORT_CLASS = "nemo_tau2.testing.slow_import:SlowImportTau2ResourcesServer"  # 5 s to import
LEASE_S = 25.0  # >= the watcher's detection time with the defaults, 3 x (2 + 5) s
PROTOCOL_ROUTES = {"/", "/seed_session", "/verify", "/end_session", "/session_stats", "/aggregate_metrics"}
SEEDED = re.compile(r"session seeded: (\w+) task (\S+), episode (\w+)")
STARTED = re.compile(r"episode started: (\w+) task (\S+) sample (\d+) on \S+, episode (\w+)")
POSTED = re.compile(r'"POST (/\S*) HTTP')
SMALL = {"object_store_memory": 80 * 1024**2}


@pytest.fixture(scope="module")
def cluster():
    ray = import_ray()
    cluster = Cluster(  # not connected: the run joins it through cluster.ray_address, as on a real cluster
        initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "resources": {"fake_gpu": 1}, **SMALL}
    )
    workers = [cluster.add_node(num_cpus=2, resources={GYM: 2}, **SMALL) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, workers
    ray.shutdown()
    for node in [*cluster.worker_nodes, cluster.head_node]:  # no graceful wait: the servers are stopped already
        cluster.remove_node(node, allow_graceful=False)
    cluster.shutdown()


@pytest.fixture(scope="module")
def environment(cluster, tmp_path_factory):
    fake = GenerationConfig(backend="fake", fake_cfg={}, temperature=0.0, top_p=1.0)
    spec = Tau2EnvironmentSpec(
        policy=fake,
        user=None,  # the user on the same fake (one process fewer)
        domains=["airline", "retail"],
        gym=NemoGymEnvConfig(
            agent_replicas=2,
            resources_replicas=2,
            resources_retry=RetryConfig(timeout_s=30, max_attempts=2, backoff_s=0.2),
        ),
        log_dir=tmp_path_factory.mktemp("server_logs"),
        cluster=ClusterConfig(
            ray_address=cluster[0].address,
            gym_placement="ray",
            gym_node_resource=GYM,
            gym_server_restarts=1,
            lease_timeout_s=LEASE_S,
        ),
    )
    with Tau2Environment(spec) as env:
        yield env


def _rows(tasks: list[str], sample: int) -> list[dict]:
    return [task_row(domain, task) | {"sample_index": sample} for domain in ("airline", "retail") for task in tasks]


def _log_lines(env: Tau2Environment, name: str) -> list[str]:
    return Path(env.servers.log_path(name)).read_text(errors="replace").splitlines()


def _seeded(env: Tau2Environment) -> dict[str, str]:
    """Episode key -> the resources replica whose log says it seeded that episode's session."""
    return {m[3]: name for name in RESOURCES for line in _log_lines(env, name) if (m := SEEDED.search(line))}


def _started(env: Tau2Environment, sample: int) -> dict[tuple[str, str], tuple[str, str]]:
    """(domain, task) of this sample -> (agent replica, episode key), from the agents' logs."""
    found = {}
    for name in AGENTS:
        for line in _log_lines(env, name):
            if (m := STARTED.search(line)) and int(m[3]) == sample:
                found[(m[1], m[2])] = (name, m[4])
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][0] != "Z"
    except FileNotFoundError:
        return False


def _described(pids: list[int]) -> list[str]:
    """Each process: its pid, its parent's and its command line (what a check of leftovers names)."""
    described = []
    for pid in pids:
        with contextlib.suppress(OSError):
            parent = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[1]
            command = Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()
            described.append(f"{pid} (parent {parent}): {command[:200]}")
    return described


def _assert_free(url: str) -> None:
    """Nothing listens on the server's address and port any more (it bound its node's address, not 127.0.0.1).
    SO_REUSEADDR, as servers bind: a closed connection's TIME_WAIT does not count, a listener still does."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen()


def test_a_run_joins_the_cluster_at_ray_address_and_its_trainer_ranks_train_there(cluster, tmp_path):
    """``training_setup.open_cluster`` joins ``cluster.ray_address`` before the trainer starts: the trainer's Ray
    ranks are actors of that cluster (not of a private local Ray), and gloo between them trains. First in the module:
    the Gym servers of the later tests hold the worker nodes' CPUs."""
    ray_cluster, _ = cluster
    overrides = [f"++cluster.ray_address={ray_cluster.address}", "policy.num_workers=2",
                 f"checkpointing.checkpoint_dir={tmp_path}", f"logger.log_dir={tmp_path}"]  # fmt: skip
    raw = apply_overrides(load_config(GRPO_SMOKE), overrides)
    cfg = validate_config(raw, GRPOMasterConfig)
    tiny = build_tiny_model(seed=0)
    small = {"model_name": "tiny", "train_global_batch_size": 2, "train_micro_batch_size": 1}
    policy_cfg = cfg.policy.model_copy(update=small | {"max_total_sequence_length": 32})
    ray = import_ray()
    with ExitStack() as resources:
        open_cluster(cfg, resources)
        assert ray.get_runtime_context().gcs_address == ray_cluster.address
        policy = Policy(policy_cfg, model=tiny.model, tokenizer=tiny.tokenizer)
        resources.callback(policy.shutdown)
        assert set(policy._workers.node_ids) <= {node["NodeID"] for node in ray.nodes() if node["Alive"]}
        sequences = [
            TrainingSequence(list(range(5, 17)), [0] * 6 + [1] * 6, [-1.0] * 12, advantage=a) for a in (1, -1)
        ]
        metrics = policy.train(sequences, NLLLossFn())
        assert metrics["num_optimizer_steps"] == 1 and math.isfinite(metrics["loss"])
    assert not ray.is_initialized()  # the run left the cluster; the cluster runs on
    assert len(ray_cluster.list_all_nodes()) == 3


def test_cluster_keys_are_checked_with_a_one_line_fix_and_reach_the_eval():
    def eval_config(*overrides: str) -> EvalMasterConfig:  # as run_eval.py reads it (NeMo-RL layout translation)
        return setup_eval(apply_overrides(load_config(EVAL_FAKE), list(overrides)))

    with pytest.raises(ConfigError, match=r"cluster.ray_address: .*set cluster.ray_address=auto"):
        eval_config("cluster.ray_address=not an address")
    with pytest.raises(ConfigError, match=r"set cluster.gym_placement=ray"):
        eval_config("env.nemo_gym.agent_replicas=2")
    cfg = eval_config(
        "cluster.ray_address=auto", "cluster.gym_placement=ray", "cluster.gym_node_resource=gym_cpu",
        "env.nemo_gym.agent_replicas=2",
    )  # fmt: skip
    assert cfg.cluster == ClusterConfig(ray_address="auto", gym_placement="ray", gym_node_resource=GYM)
    assert cfg.gym_env().agent_replicas == 2
    grpo = apply_overrides(load_config(GRPO_SMOKE), ["++env.nemo_gym.resources_replicas=2"])
    with pytest.raises(ConfigError, match=r"set cluster.gym_placement=ray"):
        validate_config(grpo, GRPOMasterConfig)
    with pytest.raises(ConfigError, match=r"cluster.gym_node_resource: .*custom resource name"):
        validate_config(apply_overrides(grpo, ["++cluster.gym_node_resource=GPU"]), GRPOMasterConfig)


def test_a_placement_the_cluster_cannot_hold_is_refused_at_once_naming_the_fix(cluster, tmp_path):
    spec = ServerSpec(RESOURCES_SERVER, "resources_servers", "tau2", RESOURCES_SERVER_CLASS, {"domain": "agent"})
    config = ClusterConfig(ray_address=cluster[0].address, gym_placement="ray", gym_node_resource="gpu_free_cpu")
    began = time.monotonic()
    with pytest.raises(ServerStartError, match=r"cannot hold 1 Gym server bundles .* ray start --resources="):
        RayGymServers([ServerGroup("resources", [spec])], config, log_dir=tmp_path).start()
    assert time.monotonic() - began < 60  # not the startup timeout


def test_each_replica_runs_on_a_gym_node_and_binds_the_address_its_node_reports(cluster, environment):
    head, workers = cluster[0].head_node, cluster[1]
    placement = environment.servers.placement
    gym_nodes = {worker.node_id for worker in workers}
    assert {node["node_id"] for node in placement.values()} == gym_nodes  # none on the "GPU" head
    assert head.node_id not in gym_nodes
    assert {placement[name]["node_id"] for name in RESOURCES} == gym_nodes  # SPREAD: one replica per node
    assert {placement[name]["node_id"] for name in AGENTS} == gym_nodes
    for i, agent in enumerate(AGENTS):  # an agent's model servers share its node
        suffix = "" if i == 0 else f"_{i}"
        for model in (POLICY_MODEL + suffix, USER_MODEL + suffix):
            assert placement[model]["node_id"] == placement[agent]["node_id"]
    for name, node in placement.items():
        assert environment.servers.url(name).startswith(f"http://{node['ip']}:")
    assert environment.agent_urls == {AGENT: [environment.servers.url(name) for name in AGENTS]}


def test_episodes_balance_over_the_replicas_and_each_stays_on_one_resources_replica(environment):
    results = run_nemo_gym_rollout_sync(
        _rows(["0", "1", "2"], sample=0), environment.agent_urls, SAMPLING, 1, keep_full_result=True
    )
    assert [r.status for r in results] == [OK] * 6 and all(r.reward == 1.0 for r in results)
    started, seeded = _started(environment, sample=0), _seeded(environment)
    assert set(started) == {(r.domain, r.task_id) for r in results}
    assert set(Counter(agent for agent, _ in started.values())) == set(AGENTS)  # both agents got episodes
    replica_of = {episode: seeded[key] for episode, (_, key) in started.items()}
    assert set(replica_of.values()) == set(RESOURCES)  # both resources replicas got episodes
    # Every tool call of an episode reached the replica that seeded it: per replica, the tool POSTs in its access
    # log are exactly the tool calls of the episodes it seeded, and it verified exactly those episodes.
    tool_calls = Counter()
    for r in results:
        calls = [item for item in r.full_result["response"]["output"] if item.get("type") == "function_call"]
        tool_calls[replica_of[(r.domain, r.task_id)]] += len(calls)
    for name in RESOURCES:
        posts = [m[1] for line in _log_lines(environment, name) if (m := POSTED.search(line))]
        assert sum(path not in PROTOCOL_ROUTES for path in posts) == tool_calls[name] > 0, name
        assert posts.count("/verify") == posts.count("/seed_session") == Counter(replica_of.values())[name]


def _rollout_in_background(env: Tau2Environment, rows: list[dict], concurrency: int):
    """Run a batch in a thread; each episode's result with the time it came back (monotonic)."""
    arrivals: list[tuple[float, object]] = []

    async def collect() -> None:
        async for group in run_async_nemo_gym_rollout(
            rows, env.agent_urls, SAMPLING, 1, max_concurrency=concurrency
        ):  # fmt: skip
            arrivals.extend((time.monotonic(), result) for result in group.results)

    run = threading.Thread(target=asyncio.run, args=(collect(),))
    run.start()
    return run, arrivals


def _running(env: Tau2Environment, agent: str) -> int:
    return requests.get(env.servers.url(agent) + "/progress", timeout=10).json()["running_episodes"]


def _wait_running(env: Tau2Environment, at_least: dict[str, int]) -> None:
    deadline = time.monotonic() + 120
    while any(_running(env, agent) < count for agent, count in at_least.items()):
        assert time.monotonic() < deadline, f"episodes did not reach {at_least}"
        time.sleep(0.1)


def test_a_silent_gym_node_ends_its_episodes_within_30_s_naming_the_cause_and_its_servers_start_again(
    cluster, environment
):
    """A Gym node whose processes all stop (its raylet, the launcher, the servers: a hung host or a partition)
    keeps its ports open and answers nothing. The watcher's probes declare its servers lost: the episodes in flight
    there end as infrastructure errors naming that, within 30 s (Ray gives the node up much later); the others
    finish; the servers start again on a live node (cluster.gym_server_restarts=1), where the next batch runs."""
    ray_cluster, workers = cluster
    servers = environment.servers
    silent_id = servers.placement[AGENTS[1]]["node_id"]
    silent = next(w for w in workers if w.node_id == silent_id)
    held = sorted(name for name, node in servers.placement.items() if node["node_id"] == silent_id)
    spare = ray_cluster.add_node(num_cpus=2, resources={GYM: 2}, **SMALL)
    ray_cluster.wait_for_nodes()
    environment.policy.engine.set_latency(100)  # episodes long enough to be cut
    run, arrivals = _rollout_in_background(environment, _rows([str(i) for i in range(4)], sample=2), 4)
    _wait_running(environment, {AGENTS[1]: 1})
    raylet = psutil.Process(silent.all_processes["raylet"][0].process.pid)
    stopped = [raylet, *raylet.children(recursive=True)]
    assert {servers.pid(name) for name in AGENTS[1:]} <= {process.pid for process in stopped}
    fork_server = psutil.Process(servers.placement[AGENTS[1]]["fork_server_pid"])
    ours = [fork_server.parent(), fork_server, *fork_server.children(recursive=True)]  # launcher, fork server, servers
    old_urls = [servers.url(name) for name in held]
    for process in stopped:
        process.suspend()  # SIGSTOP
    silenced = time.monotonic()
    try:
        run.join(timeout=120)
        assert not run.is_alive() and len(arrivals) == 8
        failed = [(at, r) for at, r in arrivals if r.status != OK]
        assert failed, "no episode was in flight on the silent node"
        started = _started(environment, sample=2)
        print(
            f"silent node: {len(failed)} episode(s) ended {max(at for at, _ in failed) - silenced:.1f} s after SIGSTOP"
        )
        cause = (
            "the agent replica was declared lost mid-episode: its agent did not answer 3 health probes in a row "
            f"({servers.cluster.gym_health_timeout_s:g} s each); the episode was dropped"
        )
        agent_at = f"{servers.url(AGENTS[1])}; {AGENTS[1]} at {servers.url(AGENTS[1])} on {silent.node_ip_address}"
        ended_within = servers.cluster.gym_detection_s + 30  # the watcher's detection, and a loaded box's margin
        for at, r in failed:
            assert at - silenced < ended_within, f"a silent node's episode ended {at - silenced:.0f} s after SIGSTOP"
            assert r.cause == cause and r.error == f"{cause} ({agent_at})"  # word for word: the record
            assert started[(r.domain, r.task_id)][0] == AGENTS[1] and r.reward is None
        assert describe_causes(failure_causes(r for _, r in arrivals)) == f"{len(failed)}x {cause}"  # the step line
        assert all(r.reward == 1.0 for _, r in arrivals if r.status == OK)
        deadline = time.monotonic() + 120
        while servers.placement[AGENTS[1]]["node_id"] != spare.node_id or servers.health.cause(servers.url(AGENTS[1])):
            assert time.monotonic() < deadline, "the silent node's servers did not start again"
            time.sleep(0.5)
        while not servers.watch.restarts:
            assert time.monotonic() < deadline, "the restart did not finish"
            time.sleep(0.5)
        moved = [name for name, node in servers.placement.items() if node["node_id"] == spare.node_id]
        assert sorted(moved) == held  # the agent with its model servers and the resources replica it used
        assert silent_id not in servers.launchers
        environment.policy.engine.set_latency(0)
        results = run_nemo_gym_rollout_sync(_rows(["0", "1"], sample=3), environment.agent_urls, SAMPLING, 1)
        assert [r.status for r in results] == [OK] * 4  # the run goes on, over the live replicas only
        assert {agent for agent, _ in _started(environment, sample=3).values()} <= set(AGENTS)
        _wake_and_check_that_ours_end(stopped, ours, old_urls)
    finally:
        for process in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        ray_cluster.remove_node(silent, allow_graceful=False)
        workers[workers.index(silent)] = spare  # the lost-node test below removes a node of these


def _wake_and_check_that_ours_end(stopped: list, ours: list, old_urls: list[str]) -> None:
    """The silent node wakes (a partition healing) long after its lease ran out: every process of ours there (the
    launcher, the fork server, the servers and their children, by pid and start time) ends within LEASE_S, and none
    answers another run meanwhile (409 naming both runs, or no answer)."""
    identities = {(process.pid, process.create_time()) for process in ours}
    for process in stopped:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.resume()  # SIGCONT
    woke = time.monotonic()
    answers = []
    while any(_same_process(*identity) for identity in identities):
        for url in old_urls:
            try:
                answer = requests.get(f"{url}/", headers={RUN_ID_HEADER: "another-run"}, timeout=2)
                answers.append(answer.status_code)
                assert answer.status_code == 409 and "not to run another-run" in answer.json()["detail"], answer.text
            except requests.RequestException:
                answers.append(None)
        assert time.monotonic() - woke < LEASE_S, f"alive {LEASE_S} s after the wake-up: {identities}"
        time.sleep(0.2)
    print(f"woken node: every process of ours ended {time.monotonic() - woke:.1f} s after SIGCONT; answers {answers}")


def _same_process(pid: int, started: float) -> bool:
    with contextlib.suppress(psutil.NoSuchProcess):
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    return False


def test_a_server_log_is_read_on_its_node_and_only_a_log_the_head_cannot_see_is_copied(environment):
    """``GymNodeLauncher.log_tail`` reads the last bytes of a server's log on the server's node, with the file's
    identity; on one box every node writes where the head reads, so nothing is copied."""
    servers = environment.servers
    path = Path(servers.log_path(RESOURCES[1]))
    launcher = servers.launchers[servers.placement[RESOURCES[1]]["node_id"]]
    tail = import_ray().get(launcher.log_tail.remote(str(path), 200), timeout=30)
    data, stat = path.read_bytes(), path.stat()
    assert tail["data"] == data[-200:] and tail["size"] == len(data) > 200
    assert tail["file"] == [stat.st_dev, stat.st_ino] and tail["ip"] == servers.placement[RESOURCES[1]]["ip"]
    assert import_ray().get(launcher.log_tail.remote(str(path) + ".absent", 200), timeout=30) is None
    assert servers.copy_remote_log_tails() == []


def test_a_lost_node_fails_only_the_episodes_it_held_and_leaves_no_process(cluster, environment, request):
    """A node removed (a crash) with episodes in flight on both: only those it held fail, within 15 s of Ray
    marking it dead, at most its share (1 of 2 nodes) of those in flight plus 10% (each agent's sessions live on
    its own node's resources replica); the rest finish on the survivor."""
    request.addfinalizer(environment.stop)  # a failed check too: the module's next tests place groups of its names
    servers = environment.servers
    lost = servers.placement[AGENTS[1]]["node_id"]
    lost_servers = [name for name, node in servers.placement.items() if node["node_id"] == lost]
    (lost_resources,) = set(lost_servers) & set(RESOURCES)
    environment.policy.engine.set_latency(100)  # episodes long enough to be cut
    run, arrivals = _rollout_in_background(environment, _rows([str(i) for i in range(6)], sample=1), 4)
    _wait_running(environment, {AGENTS[0]: 2, AGENTS[1]: 2})
    in_flight = sum(_running(environment, agent) for agent in AGENTS)
    # turns slower from now: the episodes in flight are still running when the crash reaches the lost node's servers
    # (seconds on a loaded box: at 100 ms a turn they had all finished first, and none was cut)
    environment.policy.engine.set_latency(500)
    # the pids on the lost node, taken now: once its servers are started again elsewhere, servers.pid names the new
    # ones (run alone, this test's servers were started again on the survivor, and it waited for those to end)
    lost_pids = [servers.pid(name) for name in lost_servers]
    cluster[0].remove_node(next(w for w in cluster[1] if w.node_id == lost), allow_graceful=False)  # a crash
    removed = time.monotonic()
    run.join(timeout=300)
    results = [r for _, r in arrivals]
    assert not run.is_alive() and len(results) == 12
    failed = {(r.domain, r.task_id) for r in results if r.status != OK}
    assert all(at - removed < 15 for at, r in arrivals if r.status != OK)
    print(f"lost node: {len(failed)} of {in_flight} in flight failed")
    assert len(failed) / in_flight <= 1 / 2 + 0.1, f"{len(failed)} of {in_flight} in flight failed"
    started, seeded = _started(environment, sample=1), _seeded(environment)
    held = {
        episode for episode, (agent, key) in started.items() if agent == AGENTS[1] or seeded.get(key) == lost_resources
    }
    assert failed and failed <= held  # cut mid-episode, never another node's
    assert all(r.reward is None for r in results if r.status != OK)
    # word for word: each lost episode names the node loss, however the watcher found it first: its agent's
    # "stopping" answer or dropped connection, or its agent's "no answer" from the resources replica there, waits for
    # the watcher's verdict
    ways = ["was on a node Ray marked dead", "lost its node's launcher actor"]
    forms = [
        "the agent replica was declared lost mid-episode: its agent {}; the episode was dropped",  # on the node
        "the agent replica lost a server mid-episode: its resources server {}; the episode was dropped",  # beside
    ]
    causes = {form.format(how) for form in forms for how in ways}
    lost_causes = failure_causes(results)
    assert set(lost_causes) <= causes, lost_causes
    line = describe_causes(lost_causes)  # the step line
    assert line == "; ".join(f"{count}x {cause}" for cause, count in lost_causes.most_common())
    assert all(r.reward == 1.0 for r in results if r.status == OK)
    # once Ray marks the node dead the head releases its launcher and renews its lease no more, whether its servers
    # were started again elsewhere or dropped (a dropped group's node used to keep its launcher, renewed, to the end)
    deadline = time.monotonic() + 30
    while (lost in servers.launchers or any(_alive(pid) for pid in lost_pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert lost not in servers.launchers
    assert not any(_alive(pid) for pid in lost_pids), _described([pid for pid in lost_pids if _alive(pid)])
    (survivor,) = set(servers.launchers) - {lost}
    survivors = [servers.pid(name) for name, node in servers.placement.items() if node["node_id"] == survivor]
    import_ray().kill(servers.launchers[survivor])  # the launcher actor ends: its node's servers with it
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in survivors) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in survivors)
    pids, urls = servers.process_ids(), [servers.url(name) for name in servers.placement]
    environment.stop()  # placement groups removed, the run's Ray connection closed
    assert not [pid for pid in pids if _alive(pid)]  # the fork servers too
    for url in urls:
        _assert_free(url)


def test_a_start_longer_than_the_lease_keeps_its_servers(cluster, tmp_path):
    """Each launcher holds its node's lease from its own start, so the head renews from the first launcher on: a
    start that outlasts ``lease_timeout_s`` (many servers, a loaded box: 36 s against the 25 s above, beside
    NeMo-RL's runs) had its launchers end themselves before their servers were up. Here the server class takes
    longer to import than the lease lasts, so the start outlasts it on any box; the lease (4 s, renewed every 0.67 s)
    leaves a loaded box's renewals seconds to spare (1.5 s did not, in CI)."""
    spec = ServerSpec(RESOURCES_SERVER, "resources_servers", "tau2", SLOW_IMPORT_CLASS, {"domain": "agent"})
    lease_s = 4.0
    config = ClusterConfig(
        ray_address=cluster[0].address, gym_placement="ray", gym_node_resource=GYM, lease_timeout_s=lease_s,
        gym_health_failures=1, gym_health_interval_s=0.25, gym_health_timeout_s=0.5,
    )  # fmt: skip
    began = time.monotonic()
    with RayGymServers([ServerGroup("resources", [spec])], config, log_dir=tmp_path) as servers:
        assert time.monotonic() - began > lease_s  # the start outlasted the lease
        time.sleep(1.5 * lease_s)  # renewed all along
        assert all(_alive(pid) for pid in servers.process_ids())
        assert requests.get(servers.url(spec.name) + "/", timeout=10).ok
        pids = servers.process_ids()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in pids)


HEAD_RUN = """
import json, sys, time
from nemo_tau2.cluster import ClusterConfig
from nemo_tau2.gym.launch import ServerSpec
from nemo_tau2.gym.ray_servers import RayGymServers
from nemo_tau2.gym.stack import RESOURCES_SERVER_CLASS, ServerGroup

spec = ServerSpec("tau2_resources_server", "resources_servers", "tau2", RESOURCES_SERVER_CLASS, {"domain": "agent"})
cluster = ClusterConfig(ray_address=sys.argv[1], gym_placement="ray", gym_node_resource="gym_cpu",
                        lease_timeout_s=float(sys.argv[3]))
with RayGymServers([ServerGroup("resources", [spec])], cluster, log_dir=sys.argv[2]) as servers:
    print("SERVING", json.dumps({"pids": servers.process_ids(), "url": servers.url(spec.name)}), flush=True)
    while True:
        time.sleep(1)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_ctrl_c_or_kill_9_on_the_head_process_ends_its_ray_placed_servers(cluster, tmp_path, how):
    """Ctrl-C: the head stops them. kill -9: nothing of the head runs; they end within the lease (Ray ends the
    actors the head owned, and with them what they started; the lease bounds it where Ray could not)."""
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD_RUN, cluster[0].address, str(tmp_path), str(LEASE_S)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=as_from_a_terminal,
    )
    try:
        lines = iter(head.stdout.readline, "")  # Ray may print its own lines to the driver's stdout
        started = json.loads(next((line for line in lines if line.startswith("SERVING ")), " {}").split(" ", 1)[1])
        assert started, "the head process did not start its servers"
        assert requests.get(started["url"] + "/", timeout=10).ok
        head.send_signal(how)
        head.wait(timeout=60)
    finally:
        head.kill()
    deadline = time.monotonic() + (30 if how == signal.SIGINT else LEASE_S)
    while any(_alive(pid) for pid in started["pids"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in started["pids"])
    _assert_free(started["url"])


def test_ray_node_death_output_goes_to_the_run_log_not_its_console(cluster, tmp_path, capfd, caplog):
    """A node whose raylet dies: each of its agents publishes "Raylet is terminated" with the raylet log's last 20
    lines (about 40 lines) to every driver. A run's driver writes them to ``ray.log`` in its log folder and leaves
    one line on the console."""
    ray_cluster, _ = cluster
    node = ray_cluster.add_node(num_cpus=1, object_store_memory=80 * 1024**2)
    ray_cluster.wait_for_nodes()
    log = tmp_path / "ray.log"
    try:
        with run_ray(ClusterConfig(ray_address=ray_cluster.address), NemoGymEnvConfig(), None, output_log=log):
            (raylet,) = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET]
            raylet.process.kill()  # the node's agents outlive it long enough to report it
            deadline = time.monotonic() + 90
            while "Raylet is terminated" not in (log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, "no word of the dead raylet within 90 s"
                time.sleep(0.5)
    finally:
        ray_cluster.remove_node(node, allow_graceful=False)
    console = capfd.readouterr()
    assert "Raylet is terminated" not in console.out + console.err
    assert "(raylet" in log.read_text() and len(log.read_text().splitlines()) > 10
    (line,) = [r.getMessage() for r in caplog.records if "Raylet is terminated" in r.getMessage()]
    assert line.startswith("Ray: Raylet is terminated") and str(log) in line
