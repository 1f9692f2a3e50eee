"""The one file of nemo-tau2 that runs inside a tau2 release's own environment (``scripts/build_tau2_env.sh``).

It imports only tau2, the standard library and its siblings ``nemo_tau2_tau2_*`` (tau2 v1.0.1 cannot share an
environment with NeMo-Gym: their ``openai`` pins conflict), and answers JSON requests, one per line on stdin, one
answer per line on the stdout it was started with (tau2's own prints are moved to stderr first). Everything
version-specific is the release's, through its public API: tasks and splits (``tau2.runner``), environments and tools
(``build_environment``, ``Environment.get_response``), prompts (``LLMAgent``, ``build_user``), the reward
(``evaluate_simulation``, NL judge included). Every environment is tau2's constructor with its runner's arguments
(``_retrieval``: banking_knowledge's variant), on a fork of one DB snapshot per domain (``_snapshots``); tool specs
parsed once (``_tool_specs``); ``warm`` hashes a task's gold DB in a forked child (``_warming``); the outside
services point at the run's endpoints (``_services``: judge, embeddings) and shell commands are bounded (``_shell``);
a knowledge domain's verdict comes with what the episode retrieved (``_search_log``).

Answers: ``{"id", "ok": true, "result"}`` or ``{"id", "ok": false, "kind", "error"}`` where ``kind`` is
``bad_request`` (unknown domain/task/episode, malformed message), ``judge`` (the NL-assertion judge failed),
``service`` (an embedding endpoint or the sandbox failed; both infrastructure errors, never a score) or ``internal``.
"""

import json
import os
import select
import sys
import traceback
import uuid

_PROTOCOL = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # tau2's own prints go to stderr, never into the protocol
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger  # noqa: E402  (tau2's logger; quiet unless asked)

logger.remove()
logger.add(sys.stderr, level=os.environ.get("NEMO_TAU2_TAU2_LOG_LEVEL", "ERROR"))

import nemo_tau2_tau2_forks as _forks  # noqa: E402
import nemo_tau2_tau2_search_log as _search_log  # noqa: E402
import nemo_tau2_tau2_services as _services  # noqa: E402
import nemo_tau2_tau2_shell as _shell  # noqa: E402
from nemo_tau2_tau2_retrieval import RunRetrieval  # noqa: E402
from nemo_tau2_tau2_snapshots import DomainSnapshots  # noqa: E402
from nemo_tau2_tau2_tool_specs import memoise_tool_parsing, memoise_tool_types  # noqa: E402
from nemo_tau2_tau2_warming import GoldWarming  # noqa: E402
from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT  # noqa: E402
from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage  # noqa: E402
from tau2.data_model.simulation import SimulationRun, TerminationReason  # noqa: E402
from tau2.data_model.tasks import RewardType  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.evaluator.evaluator_env import EnvironmentEvaluator  # noqa: E402
from tau2.orchestrator.orchestrator import DEFAULT_FIRST_AGENT_MESSAGE  # noqa: E402
from tau2.registry import registry  # noqa: E402
from tau2.runner import build_environment, build_user, get_tasks, load_task_splits  # noqa: E402

_JUDGE_MODULES = ("evaluator_nl_assertions.py", "llm_utils.py")


class BadRequest(ValueError):
    """The request names something the release does not have, or is malformed."""


class JudgeError(RuntimeError):
    """The NL-assertion judge did not give a usable verdict (HTTP error, invalid JSON, no results)."""


_tasks: dict[str, dict] = {}
_episodes: dict[str, dict] = {}
_retrieval = RunRetrieval()
_snapshots = DomainSnapshots()
memoise_tool_parsing()
memoise_tool_types()


def _warm_gold(domain: str, task_id: str) -> None:
    """In a warming child: tau2's own environment evaluator on the task, the trajectory that of an agent that did
    nothing, so tau2 hashes the gold DB and the initial one (the memo keeps both; the verdict is discarded)."""
    task = _task(domain, task_id)
    history = list(task.initial_state.message_history or []) if task.initial_state else []
    constructor = registry.get_env_constructor(_snapshots.forked_domain(domain))
    EnvironmentEvaluator.calculate_reward(constructor, task, history, solo_mode=False)
    _shell.remove_transient()


_warming = GoldWarming(_snapshots.hashes, _warm_gold)


def _domain_tasks(domain: str) -> dict:
    if domain not in _tasks:
        try:
            _tasks[domain] = {task.id: task for task in get_tasks(domain)}
        except Exception as e:  # noqa: BLE001  (the registry raises plain errors for unknown names)
            raise BadRequest(f"tau2 has no domain {domain!r}: {e}") from e
    return _tasks[domain]


def _task(domain: str, task_id: str):
    tasks = _domain_tasks(domain)
    if str(task_id) not in tasks:
        raise BadRequest(f"domain {domain!r} has no task {task_id!r} ({len(tasks)} tasks)")
    return tasks[str(task_id)]


def configure_retrieval(variant: str | None, kwargs: dict | None = None) -> dict:
    """The run's knowledge-retrieval variant (banking_knowledge), checked against the release's own registry."""
    try:
        return _retrieval.configure(variant, kwargs)
    except (ValueError, TypeError) as e:
        raise BadRequest(f"retrieval variant: {e}") from e


def connect_embeddings(**endpoint) -> dict:
    """Point the dense variants' embedders at the configured endpoint; the corpus is indexed now, so an endpoint
    that cannot embed it is refused at start, not mid-episode."""
    first = _task_or_first("banking_knowledge", None)
    return _services.connect_embeddings(**endpoint, index=lambda: _environment("banking_knowledge", first))


def _environment(domain: str, task):
    return build_environment(_snapshots.forked_domain(domain), env_kwargs=_retrieval.env_kwargs(domain, task))


def _task_or_first(domain: str, task_id: str | None):
    """The task a prompt or tool list is built for: the given one, else the domain's first (the same for every
    task of a domain, except banking_knowledge's golden_retrieval, whose prompt holds the task's documents)."""
    return _task(domain, task_id) if task_id is not None else next(iter(_domain_tasks(domain).values()))


def splits(domain: str) -> dict:
    tasks = _domain_tasks(domain)
    found = load_task_splits(domain) or {"base": list(tasks)}
    return {name: [str(task_id) for task_id in ids] for name, ids in found.items()}


def tasks(domain: str, split: str | None = "base") -> list:
    """The split's tasks as tau2 serialises them (``Task.model_dump(mode="json")``), in the split's order."""
    known = splits(domain)
    if split is not None and split not in known:
        raise BadRequest(f"domain {domain!r} has no split {split!r}; its splits are: {', '.join(known)}")
    by_id = _domain_tasks(domain)
    ids = known[split] if split is not None else list(by_id)
    return [by_id[task_id].model_dump(mode="json") for task_id in ids]


def agent_system_prompt(domain: str, task_id: str | None = None) -> str:
    """tau2's ``LLMAgent.system_prompt``: its instruction plus the domain policy (of ``task_id``'s environment)."""
    env = _environment(domain, _task_or_first(domain, task_id))
    return SYSTEM_PROMPT.format(domain_policy=env.get_policy(), agent_instruction=AGENT_INSTRUCTION)


def tool_schemas(domain: str, task_id: str | None = None) -> list:
    return [tool.openai_schema for tool in _environment(domain, _task_or_first(domain, task_id)).get_tools()]


def greeting() -> str:
    return DEFAULT_FIRST_AGENT_MESSAGE.content


def seed(domain: str, task_id: str) -> dict:
    """A fresh environment with the task's initial state, as tau2's orchestrator initialises it."""
    task = _task(domain, task_id)
    env = _environment(domain, task)
    state = task.initial_state
    env.set_state(
        initialization_data=state.initialization_data if state else None,
        initialization_actions=state.initialization_actions if state else None,
        message_history=list(state.message_history or []) if state else [],
    )
    env.sync_tools()
    user = build_user("user_simulator", env, task, llm="none")
    episode_id = uuid.uuid4().hex
    _episodes[episode_id] = {"domain": domain, "task": task, "env": env, "sandboxes": _shell.adopt(), "calls": []}
    schemas = _user_tool_schemas(env, user)
    return {"episode_id": episode_id, "user_system_prompt": user.system_prompt, "user_tools": schemas}


_schemas: dict[tuple, list] = {}


def warm(domain: str, task_id: str) -> dict:
    """Queue the task's gold-side warm-up (answers at once); nothing to warm where hashes are not memoised."""
    _task(domain, task_id)
    if not _snapshots.memoises_hashes(domain):
        return {"queued": False}
    return _warming.request(domain, task_id)


def _user_tool_schemas(env, user) -> list:
    """The user's tools' ``openai_schema``s, once per toolkit class and tool list: a schema is its method's."""
    key = (type(env.user_tools), tuple(tool.name for tool in user.tools or []))
    if key not in _schemas:
        _schemas[key] = [tool.openai_schema for tool in user.tools or []]
    return _schemas[key]


def _episode(episode_id: str) -> dict:
    if episode_id not in _episodes:
        raise BadRequest(f"no live episode {episode_id!r} (never seeded, or already ended)")
    return _episodes[episode_id]


def call_tool(episode_id: str, name: str, arguments: dict, requestor: str = "assistant", call_id: str = "") -> dict:
    """One call through tau2's boundary (``get_response``: any failure becomes an ``Error: ...`` message)."""
    if not isinstance(arguments, dict):
        raise BadRequest("arguments must be a JSON object")
    call = ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor)
    message = (episode := _episode(episode_id))["env"].get_response(call)
    _services.raise_faults(f"answering {name}")  # the call's answer is that failure's, not the tool's: not kept
    answer = {"content": message.content, "error": message.error}
    episode["calls"].append(((name, arguments, requestor, call_id), answer))  # what a fork runs again
    return answer


def _message(item: dict):
    role = item.get("role")
    try:
        if role == "assistant":
            return AssistantMessage.model_validate(item)
        if role == "user":
            return UserMessage.model_validate(item)
        if role == "tool":
            return ToolMessage.model_validate(item)
    except ValueError as e:
        raise BadRequest(f"malformed {role} message: {e}") from e
    raise BadRequest(f"message role must be assistant, user or tool, not {role!r}")


def _from_judge(error: BaseException) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return any(frame.filename.endswith(_JUDGE_MODULES) for frame in frames)


def evaluate(domain: str, task_id: str, messages: list, termination_reason: str) -> dict:
    """tau2's ``evaluate_simulation(..., ALL)`` of a trajectory: the release's own reward, NL judge included."""
    task = _task(domain, task_id)
    try:
        reason = TerminationReason(termination_reason)
    except ValueError:
        names = ", ".join(reason.value for reason in TerminationReason)
        raise BadRequest(f"unknown termination_reason {termination_reason!r}; this tau2's are: {names}") from None
    simulation = SimulationRun(
        id=uuid.uuid4().hex,
        task_id=task.id,
        start_time="",
        end_time="",
        duration=0.0,
        termination_reason=reason,
        messages=[_message(item) for item in messages],
    )
    _warming.before_scoring(domain, task.id)
    try:
        forked, env_kwargs = _snapshots.forked_domain(domain), _retrieval.env_kwargs(domain, task)
        info = evaluate_simulation(simulation, task, EvaluationType.ALL, False, domain=forked, env_kwargs=env_kwargs)
        _services.raise_faults("scoring")
    except Exception as e:  # noqa: BLE001  (sorted into judge faults and the rest below)
        _services.raise_faults("scoring")
        if _from_judge(e):
            raise JudgeError(f"NL-assertion judge failed: {type(e).__name__}: {e}") from e
        raise
    criteria = task.evaluation_criteria
    judged = criteria is not None and RewardType.NL_ASSERTION in criteria.reward_basis and criteria.nl_assertions
    if judged and reason in (TerminationReason.USER_STOP, TerminationReason.AGENT_STOP) and not info.nl_assertions:
        # tau2 passes an empty verdict list; an answer that grades nothing is a judge fault, not a pass.
        raise JudgeError(f"NL-assertion judge returned no results for {len(criteria.nl_assertions)} assertion(s)")
    verdict = {"reward": info.reward, "reward_info": json.loads(info.model_dump_json())}
    return verdict | _search_log.retrieval_of(domain, task, simulation.messages)  # beside the verdict, not in it


def verify(episode_id: str, messages: list, termination_reason: str) -> dict:
    """Score the episode (kept alive until scored, so a retry after a judge fault scores it again)."""
    episode = _episode(episode_id)
    result = evaluate(episode["domain"], episode["task"].id, messages, termination_reason)
    _shell.remove(_episodes.pop(episode_id, {}).get("sandboxes"))
    return result


def export(path: str, domain: str, run: dict, episodes: list) -> dict:
    """Write scored episodes as the release's results file (``Results.save``), which its own tools read:
    ``tau2 view``, ``tau2 evaluate-trajs``, ``tau2 submit``. ``run`` holds ``TextRunConfig`` fields (agent and user
    models, ``num_trials``, ``max_steps``, ``max_errors``, ``seed``); each episode ``task_id``, ``trial``, ``seed``,
    ``messages``, ``termination_reason`` and the ``reward_info`` its verify gave."""
    from tau2.data_model.simulation import Results, RewardInfo, TextRunConfig
    from tau2.runner import get_info

    try:
        config = TextRunConfig(domain=domain, **run, **_retrieval.run_fields(domain))
    except ValueError as e:
        raise BadRequest(f"run settings: {e}") from e
    simulations = []
    for index, episode in enumerate(episodes):
        task = _task(domain, episode["task_id"])
        simulations.append(
            SimulationRun(
                id=episode.get("id") or f"{domain}-{task.id}-{episode.get('trial', 0)}-{index}",
                task_id=task.id,
                start_time=episode.get("start_time", ""),
                end_time=episode.get("end_time", ""),
                duration=episode.get("duration", 0.0),
                termination_reason=TerminationReason(episode["termination_reason"]),
                reward_info=RewardInfo.model_validate(episode["reward_info"]),
                messages=[_message(item) for item in episode["messages"]],
                trial=episode.get("trial", 0),
                seed=episode.get("seed"),
            )
        )
    used = {simulation.task_id for simulation in simulations}
    tasks = [task for task_id, task in _domain_tasks(domain).items() if task_id in used]
    Results(info=get_info(config), tasks=tasks, simulations=simulations).save(path)
    return {"path": path, "num_simulations": len(simulations)}


def end(episode_id: str) -> dict:
    _shell.remove((episode := _episodes.pop(episode_id, None)) and episode["sandboxes"])
    return {"ended": episode is not None}


OPERATIONS = {
    "configure_judge": _services.configure_judge,
    "configure_retrieval": configure_retrieval,
    "connect_embeddings": connect_embeddings,
    "connect_shell": _shell.connect_shell,
    "connect_reranker": _services.connect_reranker,
    "splits": splits,
    "tasks": tasks,
    "agent_system_prompt": agent_system_prompt,
    "tool_schemas": tool_schemas,
    "greeting": greeting,
    "seed": seed,
    "call_tool": call_tool,
    "evaluate": evaluate,
    "verify": verify,
    "export": export,
    "end": end,
    "warm": warm,
    "warming": _warming.stats,
    "fork": lambda episode_id, n: _forks.fork(_episode(episode_id), n, seed, call_tool, end),
    "digest": lambda episode_id: _forks.digest(_episode(episode_id)),
}


def answer(request: dict) -> dict:
    op = OPERATIONS.get(request.get("op"))
    if op is None:
        return {"ok": False, "kind": "bad_request", "error": f"unknown op {request.get('op')!r}"}
    try:
        return {"ok": True, "result": op(**request.get("args", {}))}
    except (BadRequest, _services.Refused, _forks.ForkRefused) as e:
        return {"ok": False, "kind": "bad_request", "error": str(e)}
    except TypeError as e:
        return {"ok": False, "kind": "bad_request", "error": f"{request.get('op')}: {e}"}
    except JudgeError as e:
        return {"ok": False, "kind": "judge", "error": str(e)}
    except _services.ServiceError as e:
        return {"ok": False, "kind": "service", "error": str(e)}
    except Exception as e:  # noqa: BLE001  (reported to the caller with its traceback on stderr)
        traceback.print_exc()
        return {"ok": False, "kind": "internal", "error": f"{type(e).__name__}: {e}"}
    finally:
        _shell.remove_transient()  # sandboxes of environments no episode holds (prompts, tools, scoring)


def main() -> None:
    import importlib.metadata

    _PROTOCOL.write(json.dumps({"ready": True, "tau2_version": importlib.metadata.version("tau2")}) + "\n")
    stdin, pending = sys.stdin.fileno(), b""
    try:
        while True:  # requests on stdin, and the warming children's answers as they come
            readable, _, _ = select.select([stdin, *_warming.fds()], [], [], _warming.poll_timeout())
            for fd in readable:
                if fd != stdin:
                    _warming.on_readable(fd)
            _warming.drop_overdue()
            if stdin not in readable:
                _warming.start_next()  # no request waits: a warm-up's fork holds up none
                continue
            chunk = os.read(stdin, 1 << 20)
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line.strip():
                    _PROTOCOL.write(json.dumps(_reply(line)) + "\n")
    finally:
        _warming.close()
        _shell.close()


def _reply(line: bytes) -> dict:
    try:
        request = json.loads(line)
    except ValueError as e:
        return {"id": None, "ok": False, "kind": "bad_request", "error": str(e)}
    if not isinstance(request, dict):
        return {"id": None, "ok": False, "kind": "bad_request", "error": "a request is a JSON object"}
    reply = answer(request)
    reply["id"] = request.get("id")
    return reply


if __name__ == "__main__":
    main()
