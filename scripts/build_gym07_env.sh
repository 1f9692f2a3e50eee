#!/usr/bin/env bash
# Build (or reuse) the Python 3.13 environment with NeMo-Gym 0.7.0, the release NeMo-Gym's users have, for the tests
# that run the Gym side of nemo-tau2 on it (tests/unit/gym/test_nemo_gym_0_7.py).
#
#   scripts/build_gym07_env.sh     # the last line printed is the interpreter: export it as NEMO_TAU2_GYM07_PYTHON
#
# What goes in: the project's locked dependencies for Python 3.13 (uv.lock's second branch: nemo-gym 0.7.0, openai
# 2.44.0), no extras (the Gym servers, agent and eval, not the trainer), and the project itself without its
# dependencies (for its entry points; tests import the checkout through PYTHONPATH). NeMo-Gym 0.7.0 declares
# Requires-Python >= 3.13.14; where the interpreter found is an older 3.13 (pyenv's 3.13.0), uv installs for
# 3.13.14 with --python-version (the wheels are pure Python or cp313, so they are the same files). Interpreter:
# NEMO_TAU2_PYTHON313, else pyenv's 3.13, else python3.13 on PATH. Where: NEMO_TAU2_GYM07_ENV, else
# ~/.cache/nemo-tau2/nemo-gym-0.7.0-py3.13. Idempotent: a stamp (the locked requirements' hash and the interpreter)
# written last; a later run with the same stamp only checks that NeMo-Gym imports.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ENV_DIR="${NEMO_TAU2_GYM07_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/nemo-tau2/nemo-gym-0.7.0-py3.13}"
DECLARED=3.13.14
log() { echo "[build_gym07_env] $*" >&2; }
# shellcheck source=env_cache.sh
source "$ROOT/scripts/env_cache.sh"

if [ $# -gt 0 ]; then log "error: no arguments expected (usage: $0)"; exit 2; fi
if ! command -v uv >/dev/null 2>&1; then log "error: uv not found (install it: pip install uv)"; exit 2; fi

if [ -n "${NEMO_TAU2_PYTHON313:-}" ]; then
  PYTHON="$NEMO_TAU2_PYTHON313"
elif command -v pyenv >/dev/null 2>&1 && pyenv prefix 3.13 >/dev/null 2>&1; then
  PYTHON="$(pyenv prefix 3.13)/bin/python3.13"
elif command -v python3.13 >/dev/null 2>&1; then
  PYTHON="$(command -v python3.13)"
else
  log "error: Python 3.13 not found (install it, e.g. pyenv install 3.13.14, or set NEMO_TAU2_PYTHON313)"
  exit 2
fi
VERSION="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
case "$VERSION" in
  3.13.*) ;;
  *) log "error: $PYTHON is Python $VERSION, not 3.13 (set NEMO_TAU2_PYTHON313 to a 3.13 interpreter)"; exit 2 ;;
esac

REQUIREMENTS="$(mktemp)"
trap 'rm -f "$REQUIREMENTS"' EXIT
(cd "$ROOT" && uv export --frozen --no-hashes --no-emit-project --no-dev --quiet) > "$REQUIREMENTS"
STAMP="$(sha256sum "$REQUIREMENTS" | cut -c1-16) python$VERSION"

imports_ok() { "$ENV_DIR/bin/python" -c "import nemo_gym.server_utils, responses_api_models.vllm_model.app" >/dev/null 2>&1; }

env_cache_reuse_or_lock  # one build at a time per folder; a finished one is reused

log "building $ENV_DIR ($STAMP; Python $VERSION installing for $DECLARED, what nemo-gym 0.7.0 declares)"
rm -rf "$ENV_DIR"
uv venv --quiet --python "$PYTHON" "$ENV_DIR"
uv pip install --quiet --python "$ENV_DIR/bin/python" --python-version "$DECLARED" -r "$REQUIREMENTS"
uv pip install --quiet --python "$ENV_DIR/bin/python" --python-version "$DECLARED" --no-deps "$ROOT"

env_cache_stamp "NeMo-Gym" "$ENV_DIR/bin/python" -c 'import nemo_gym.server_utils'
