"""nemo-tau2: tau2-bench as a NeMo-Gym environment, with multi-turn rollouts, evaluation and GRPO.

Importing this package makes tau2 safe to use offline: litellm (pulled in by parts of tau2) must read its
bundled model cost map instead of fetching one from the network, and tau2's loguru output is routed into
the standard `logging` module (logger name ``tau2``) so applications control it like any other library log.
It also keeps Ray from re-launching its workers through ``uv run`` and from lowering their priority (see below).
"""

import os

# Must be set before anything imports litellm (tau2.registry, tau2.agent, tau2.user do): no network at run time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Under `uv run`, Ray would start its workers with `uv run` in an uploaded copy of the working directory: slow,
# and without this environment's optional extras (torch). Our Ray workers run this interpreter in this environment.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# Ray lowers its workers' priority (nice 15) so that a driver stays responsive; in our runs the workers (the trainer's
# ranks, generation replicas, Gym servers) are the run's work. Beside one ordinary busy process a nice-15 worker gets
# ~3% of a core: the Megatron policy test took 636 s instead of 61 beside four busy loops (166 s at the same priority).
# Read by the raylet of a Ray this process (or a child) starts; a cluster started elsewhere keeps its own setting.
os.environ.setdefault("RAY_worker_niceness", "0")
# transformers 5 draws a tqdm bar ("Loading weights") for every model it loads, from files on disk (nothing is
# downloaded at run time): in a run's output and logs it redraws with carriage returns between the step rows. Its
# switch is huggingface_hub's, read when huggingface_hub is first imported; it reaches our child processes too.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from nemo_tau2._logging import route_tau2_logs  # noqa: E402

route_tau2_logs()

__version__ = "0.1.0"
