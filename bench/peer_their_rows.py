"""Rows for NeMo-Gym 0.7.0's own tau2 agent, built with tau2 v1.0.1 (run in their agent's environment).

Their benchmark's rows come from a script of their tau2 fork (``dump_nemo_gym_data.sh``, not in v1.0.1), so these
are built from tau2's own parts as that agent reads them: a ``TextRunConfig`` dump, the ``Task``, the seed, and
``responses_create_params`` holding the agent's system prompt (``LLMAgent.system_prompt``) and the domain's tools.

stdin: ``{"episodes": [[domain, task_id, seed], ...], "temperature", "top_p", "max_steps", "retrieval_config"}``;
stdout: one row per line, in that order.
"""

import json
import os
import sys

_OUT = os.fdopen(os.dup(sys.stdout.fileno()), "w")
os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # tau2 prints while importing
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger  # noqa: E402

logger.remove()

from tau2.agent.llm_agent import LLMAgent  # noqa: E402
from tau2.data_model.simulation import TextRunConfig  # noqa: E402
from tau2.registry import registry  # noqa: E402

_RUN_ARGUMENTS = {  # run_single_task's keyword arguments that their agent pins (Literal types in its request model)
    "evaluation_type": "all", "save_dir": None, "user_voice_settings": None, "user_persona_config": None,
    "verbose_logs": False, "audio_debug": False, "audio_taps": False, "auto_review": False, "review_mode": "full",
    "hallucination_feedback": None,
}  # fmt: skip


KNOWLEDGE = "banking_knowledge"  # its environment is built for a retrieval variant, as tau2's runner builds it


def domain_parts(domain: str, variant: str) -> tuple[dict, str, list[dict]]:
    tasks = {task.id: task for task in registry.get_tasks_loader(domain)(task_split_name=None)}
    env = registry.get_env_constructor(domain)(**({"retrieval_variant": variant} if domain == KNOWLEDGE else {}))
    tools = env.get_tools()
    prompt = LLMAgent(tools=tools, domain_policy=env.get_policy(), llm="unused").system_prompt
    schemas = [tool.openai_schema["function"] for tool in tools]
    responses_tools = [
        {"type": "function", "name": s["name"], "description": s["description"], "parameters": s["parameters"],
         "strict": False}
        for s in schemas
    ]  # fmt: skip
    return tasks, prompt, responses_tools


def main() -> None:
    request = json.load(sys.stdin)
    parts = {}
    for domain, task_id, seed in request["episodes"]:
        if domain not in parts:
            parts[domain] = domain_parts(domain, request["retrieval_config"])
        tasks, prompt, tools = parts[domain]
        config = TextRunConfig(
            domain=domain, llm_agent="unused", llm_user="unused", save_to="", log_level="ERROR",
            max_steps=request["max_steps"], seed=seed,
            retrieval_config=request["retrieval_config"] if domain == KNOWLEDGE else None,
        )  # fmt: skip
        row = {
            "config": config.model_dump(mode="json"),
            "task": tasks[task_id].model_dump(mode="json"),
            "seed": seed,
            **_RUN_ARGUMENTS,
            "responses_create_params": {
                "input": [{"role": "system", "content": prompt}],
                "tools": tools,
                "temperature": request["temperature"],
                "top_p": request["top_p"],
            },
            "agent_ref": {"type": "responses_api_agents", "name": "tau2_agent"},
        }
        _OUT.write(json.dumps(row) + "\n")
    _OUT.flush()


if __name__ == "__main__":
    main()
