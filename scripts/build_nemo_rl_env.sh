#!/usr/bin/env bash
# Build (or reuse) an environment that runs NeMo-RL's own Gym path (its NemoGym actor, run_async_nemo_gym_rollout,
# its data processor and GRPO's batch functions) unmodified, as NeMo-RL's users run it, for the tests that point it
# at our servers (tests/unit/gym/test_nemo_rl_client.py).
#
#   scripts/build_nemo_rl_env.sh --gym pinned    # the NeMo-Gym commit NeMo-RL pins (c3bac96), Python 3.13
#   scripts/build_nemo_rl_env.sh --gym 0.4.0     # NeMo-Gym 0.4.0 from PyPI, Python 3.12 (our main environment's Gym)
#
# The last line printed is the interpreter. NeMo-RL cannot be installed (PyPI's nemo-rl is a placeholder): its
# source stays where it is (../shared/vendor/nemo-rl-7ea279a beside the checkout, or NEMO_TAU2_NEMO_RL_SOURCE) and
# a .pth file puts it on the path, never copied; its bytecode goes under this environment (sys.pycache_prefix), so
# the source folder is only read. What NeMo-RL's Gym path imports is installed at the versions NeMo-RL's own uv.lock
# gives its `nemo_gym` extra (`uv export --extra nemo_gym`: transformers 5.5.4, ray 2.56.1, openai 2.6.1, ...),
# except torch, which comes without its CUDA build tag (the same 2.11.0, run on CPU here). The pinned Gym is
# installed editable, as NeMo-RL installs its submodule, from a copy of the vendored commit
# (../shared/vendor/nemo-gym-c3bac96, or NEMO_TAU2_NEMO_GYM_SOURCE) kept in this environment's folder: NeMo-Gym
# builds its own servers' virtualenvs inside that tree. That commit declares Python >= 3.13.14; where pyenv's 3.13 is
# older, uv installs for 3.13.14 (scripts/uv_python_3.13.14.toml, as for NeMo-Gym 0.7.0).
# Where: ~/.cache/nemo-tau2/nemo-rl-<commit>-gym-<gym>-py<version>-<origin key>. Idempotent: a stamp (what is
# installed) written last; a later run with the same stamp only checks that NeMo-RL's Gym path imports.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
log() { echo "[build_nemo_rl_env] $*" >&2; }
# shellcheck source=env_cache.sh
source "$ROOT/scripts/env_cache.sh"
usage="usage: $0 --gym pinned|0.4.0"

GYM=""
while [ $# -gt 0 ]; do
  case "$1" in
    --gym) GYM="${2:-}"; shift 2 ;;
    --gym=*) GYM="${1#--gym=}"; shift ;;
    *) log "error: unknown argument $1 ($usage)"; exit 2 ;;
  esac
done
case "$GYM" in
  pinned | 0.4.0) ;;
  *) log "error: --gym must be pinned or 0.4.0 ($usage)"; exit 2 ;;
esac
command -v uv >/dev/null 2>&1 || { log "error: uv not found (pip install uv)"; exit 2; }

NEMO_RL="${NEMO_TAU2_NEMO_RL_SOURCE:-$ROOT/../shared/vendor/nemo-rl-7ea279a}"
[ -f "$NEMO_RL/nemo_rl/environments/nemo_gym.py" ] && [ -f "$NEMO_RL/uv.lock" ] || {
  log "error: NeMo-RL's source not found at $NEMO_RL (a checkout with nemo_rl/ and uv.lock; set NEMO_TAU2_NEMO_RL_SOURCE)"
  exit 2
}
NEMO_RL="$(cd "$NEMO_RL" && pwd)"
NEMO_RL_COMMIT="$(sed -n 's/^# NeMo-RL at \([0-9a-f]\{7\}\).*/\1/p' "$NEMO_RL/VENDORED.md" 2>/dev/null || true)"
NEMO_RL_COMMIT="${NEMO_RL_COMMIT:-$(git -C "$NEMO_RL" rev-parse --short=7 HEAD 2>/dev/null || echo source)}"

if [ "$GYM" = pinned ]; then
  GYM_SOURCE="${NEMO_TAU2_NEMO_GYM_SOURCE:-$ROOT/../shared/vendor/nemo-gym-c3bac96}"
  [ -f "$GYM_SOURCE/nemo_gym/cli/setup_command.py" ] || {
    log "error: the NeMo-Gym commit NeMo-RL pins not found at $GYM_SOURCE (set NEMO_TAU2_NEMO_GYM_SOURCE)"
    exit 2
  }
  GYM_SOURCE="$(cd "$GYM_SOURCE" && pwd)"
  GYM_LABEL="$(sed -n 's/^# NeMo-Gym at \([0-9a-f]\{7\}\).*/\1/p' "$GYM_SOURCE/VENDORED.md" 2>/dev/null || true)"
  GYM_LABEL="${GYM_LABEL:-$(git -C "$GYM_SOURCE" rev-parse --short=7 HEAD 2>/dev/null || echo source)}"
  WANT_MINOR=3.13
  DECLARED=3.13.14
else
  GYM_LABEL=0.4.0
  WANT_MINOR=3.12
  DECLARED=""
fi

if command -v pyenv >/dev/null 2>&1 && pyenv prefix "$WANT_MINOR" >/dev/null 2>&1; then
  PYTHON="$(pyenv prefix "$WANT_MINOR")/bin/python$WANT_MINOR"
elif command -v "python$WANT_MINOR" >/dev/null 2>&1; then
  PYTHON="$(command -v "python$WANT_MINOR")"
else
  log "error: Python $WANT_MINOR not found (pyenv install $WANT_MINOR)"; exit 2
fi
VERSION="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
TARGET=(--python-version "${DECLARED:-$VERSION}")

# One folder per origin: the .pth names NeMo-RL's source folder, so two checkouts whose ../shared sits elsewhere (a
# CI mount beside this box's own) would otherwise rebuild one shared folder for each other on every run.
ORIGIN_KEY="$(printf '%s %s' "$NEMO_RL" "${GYM_SOURCE:-}" | sha256sum | cut -c1-8)"
ENV_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/nemo-tau2/nemo-rl-$NEMO_RL_COMMIT-gym-$GYM_LABEL-py$WANT_MINOR-$ORIGIN_KEY"
# What NeMo-RL's Gym path imports (nemo_rl.environments.nemo_gym, experience.rollouts, data, algorithms.grpo's batch
# functions, utils.config) and nothing of its GPU backends
PACKAGES=(torch "ray[default]" transformers datasets omegaconf hydra-core wandb pillow pyzmq numpy torchdata pyyaml
  pydantic rich colored tensordict mlflow swanlab tensorboard accelerate math-verify sympy nvtx blobfile
  tiktoken sentencepiece matplotlib plotly zstandard pybase64 fastapi uvicorn soundfile nvidia-ml-py)
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
# NeMo-RL's lock for its nemo_gym extra, as pins: local build tags dropped (+cu130), editable and git lines left out,
# and torch's own runtime (setuptools, triton, the CUDA libraries): PyPI's torch 2.11.0 brings its own, not those of
# NeMo-RL's cu130 build
uv export --frozen --no-hashes --no-emit-project --no-emit-workspace --extra nemo_gym --project "$NEMO_RL" --quiet |
  grep -E '^[A-Za-z0-9_.-]+(\[[^]]*\])?==' | grep -Ev '^(setuptools|triton|nvidia-[a-z0-9-]+|cuda-[a-z0-9-]+)==' | sed -E 's/\+[A-Za-z0-9.]+( |$)/\1/' > "$CONSTRAINTS"
STAMP="nemo-rl $NEMO_RL_COMMIT from $NEMO_RL, gym $GYM_LABEL${GYM_SOURCE:+ from $GYM_SOURCE}, python$VERSION, \
$(printf '%s\n' "${PACKAGES[@]}" | cat - "$CONSTRAINTS" | sha256sum | cut -c1-16)"

imports_ok() {
  "$ENV_DIR/bin/python" -c "
import nemo_rl.environments.nemo_gym, nemo_rl.experience.rollouts, nemo_rl.algorithms.grpo, nemo_rl.utils.config
import nemo_rl.data.processors, nemo_gym.cli, nemo_gym.rollout_collection" >/dev/null 2>&1
}
# a stamped folder: every module above still found (their import, torch's and Ray's included, ran before the stamp)
reuse_ok() {
  "$ENV_DIR/bin/python" -c "
import importlib.util, sys
modules = ['nemo_rl.environments.nemo_gym', 'nemo_rl.experience.rollouts', 'nemo_rl.algorithms.grpo',
           'nemo_rl.utils.config', 'nemo_rl.data.processors', 'nemo_gym.cli', 'nemo_gym.rollout_collection',
           'torch', 'ray', 'transformers']
sys.exit(any(importlib.util.find_spec(module) is None for module in modules))" >/dev/null 2>&1
}

env_cache_reuse_or_lock  # one build at a time per folder; a finished one is reused

log "building $ENV_DIR ($STAMP)"
rm -rf "$ENV_DIR"
uv venv --quiet --seed --python "$PYTHON" "$ENV_DIR"
install() { uv pip install --quiet --python "$ENV_DIR/bin/python" "${TARGET[@]}" -c "$CONSTRAINTS" "$@"; }
if [ "$GYM" = pinned ]; then
  # as NeMo-RL's submodule: a checkout of the commit, installed editable; its server folders get their venvs here
  cp -r "$GYM_SOURCE" "$ENV_DIR/nemo-gym"
  mkdir -p "$ENV_DIR/nemo-gym/cache"  # its setup.cfg's egg_base (a folder the repository keeps; the subset has none)
  install "${PACKAGES[@]}" -e "$ENV_DIR/nemo-gym"
else
  install "${PACKAGES[@]}" "nemo-gym==0.4.0"
fi
SITE="$("$ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
{
  echo "$NEMO_RL"
  echo "import sys; sys.pycache_prefix = sys.pycache_prefix or '$ENV_DIR/pycache'"
} > "$SITE/nemo_rl_source.pth"

env_cache_stamp "NeMo-RL's Gym path" "$ENV_DIR/bin/python" -c 'import nemo_rl.environments.nemo_gym, nemo_rl.experience.rollouts, nemo_rl.algorithms.grpo, nemo_gym.cli'
