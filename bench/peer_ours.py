"""Our tau2 Gym servers on NeMo-Gym 0.7.0 for ``bench/peer_nemo_gym_tau2.py`` (run by the 0.7.0 environment's
interpreter, this checkout on ``PYTHONPATH``): resources server, agent and NeMo-Gym model servers of our stack, tau2
v1.0.1 in its own environment, the policy and the user on an endpoint that is already running.

stdin: one JSON line ``{"base_url", "domains", "tau2_python", "retrieval_variant", "max_new_tokens", "model",
"log_dir", "gym"}`` (``gym``: ``env.nemo_gym`` keys); then it prints one JSON line ``{"agent_url", "startup_s",
"nemo_gym"}`` and serves until stdin closes.
"""

import json
import sys
import time
from importlib.metadata import version

import nemo_tau2  # noqa: F401  (offline settings before tau2 loads litellm)
from nemo_tau2.generation import GenerationConfig
from nemo_tau2.gym.environment import Tau2Environment, Tau2EnvironmentSpec
from nemo_tau2.gym.episode_config import NemoGymEnvConfig
from nemo_tau2.gym.stack import AGENT
from nemo_tau2.tau2_release.config import Tau2ReleaseConfig


def main() -> None:
    request = json.loads(sys.stdin.readline())
    policy = GenerationConfig(
        backend="openai",
        openai_cfg={"base_url": request["base_url"], "model": request["model"]},
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=request["max_new_tokens"],  # the user's too: it plays on this endpoint
    )
    spec = Tau2EnvironmentSpec(
        policy=policy,
        user=None,  # the user on the policy's endpoint, as their agent's config has it
        domains=request["domains"],
        gym=NemoGymEnvConfig.model_validate(request.get("gym") or {}),
        log_dir=request["log_dir"],
        tau2=Tau2ReleaseConfig(
            version="v1.0.1", python=request["tau2_python"], retrieval_variant=request["retrieval_variant"]
        ),
    )
    began = time.perf_counter()
    with Tau2Environment(spec) as env:
        (url,) = env.agent_urls[AGENT]
        print(json.dumps({"agent_url": url, "startup_s": round(time.perf_counter() - began, 2),
                          "nemo_gym": version("nemo-gym")}), flush=True)  # fmt: skip
        sys.stdin.read()  # until the bench closes it


if __name__ == "__main__":
    main()
