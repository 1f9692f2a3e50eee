# Sourced by scripts/build_*_env.sh: the lock, stamp and reuse rule every cached environment follows.
#
# The sourcing script sets ENV_DIR (the environment's folder), STAMP (one line saying what it installs) and defines
# log() and imports_ok() (does the environment work), and may define reuse_ok(): a cheaper check for a stamped folder
# (what must import is still there), where importing it all takes long (NeMo-RL's: ~26 s, once per test module that
# asks for it); the full imports_ok() ran before the stamp was written. Then:
#
#   env_cache_reuse_or_lock          # waits for the folder's lock; a stamped folder that imports: prints, exits 0
#   ... rm -rf "$ENV_DIR" and build it ...
#   env_cache_stamp "vLLM" python -c 'import vllm'   # checks it imports (else: the probe's last line, exit 1),
#                                                    # writes the stamp last, prints the interpreter
#
# The lock (flock on "$ENV_DIR.lock", held until the script exits) makes one build at a time per folder: a second
# run waits for the first, then reuses what it built. The stamp is written last, so a half-finished build (no stamp)
# is started again from nothing, and a folder with another stamp (what is installed changed) is rebuilt.
# nemo_tau2/env_cache.py reads the same stamp to find a finished build with nothing exported.
#
# Bytecode: `uv pip install` writes no .pyc, and where PYTHONDONTWRITEBYTECODE is set (this project's machines, CI's
# included) Python never writes one either, so every process the environment starts compiles what it imports from
# source again (tau2 v1.0.1's worker: 6.9 CPU-s to import tau2.registry without, 4.4 with). A build compiles its
# site-packages once (env_cache_stamp); a script whose environment the suite starts dozens of processes of sets
# BYTECODE_ON_REUSE=1, so a folder built before this rule is compiled on its next reuse too. The marker
# "$ENV_DIR/.nemo_tau2_bytecode" says it is done.
#
# Working folder: uv reads the settings of the project it is run in, `uv pip` too: run from this checkout, every
# build got our pyproject's [tool.uv] settings. A constraint there (filelock<3.30, now a dependency instead) met
# NeMo-RL's lock (filelock 3.31.2) and vLLM's (4.2.11), and those builds failed on a machine without them cached.
# Each environment installs its own pinned set, so env_cache_reuse_or_lock points uv's working folder
# (UV_WORKING_DIR, its --directory) at the cache folder, outside any project; the user's own uv.toml still applies.
# The script itself stays where it is: a pyenv shim finds `uv` by the folder it is run in. Build scripts pass uv
# absolute paths.

env_cache_reuse_or_lock() {
  export UV_WORKING_DIR
  UV_WORKING_DIR="$(dirname "$ENV_DIR")"
  mkdir -p "$UV_WORKING_DIR"
  exec 9>"$ENV_DIR.lock"
  flock 9
  local check=imports_ok
  declare -F reuse_ok >/dev/null && check=reuse_ok
  local stamped=0
  [ -f "$ENV_DIR/.nemo_tau2_stamp" ] && [ "$(cat "$ENV_DIR/.nemo_tau2_stamp")" = "$STAMP" ] && stamped=1
  if [ "$stamped" = 1 ] && [ "${BYTECODE_ON_REUSE:-0}" = 1 ]; then
    env_cache_compile
  fi
  if [ "$stamped" = 1 ] && "$check"; then
    log "reusing $ENV_DIR ($STAMP)"
    echo "$ENV_DIR/bin/python"
    exit 0
  fi
}

# $1: what must import (the error's subject); the rest: a command whose last line of output says why it does not
# (run only then).
env_cache_stamp() {
  local what="$1"
  shift
  if ! imports_ok; then
    log "error: $what does not import in $ENV_DIR: $("$@" 2>&1 | tail -n 1)"
    exit 1
  fi
  env_cache_compile
  echo "$STAMP" > "$ENV_DIR/.nemo_tau2_stamp"
  log "ready: $ENV_DIR"
  echo "$ENV_DIR/bin/python"
}

# Compiles the environment's site-packages to .pyc once (see Bytecode above); a file that does not compile (a
# package's own Python 2 test data) is left as it is, as Python would leave it. An environment that keeps its
# bytecode under itself (sys.pycache_prefix: NeMo-RL's and tau2's, whose sources are only read) reads no other .pyc,
# the standard library's included, so that is compiled into it too (its tests and the base's site-packages left out).
env_cache_compile() {
  [ -f "$ENV_DIR/.nemo_tau2_bytecode" ] && return 0
  [ -f "$ENV_DIR/pyvenv.cfg" ] || return 0  # not a virtual environment: never compile a base interpreter's packages
  local site stdlib
  site="$("$ENV_DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 0
  log "compiling $site to bytecode (once)"
  "$ENV_DIR/bin/python" -m compileall -q -j 0 "$site" >/dev/null 2>&1 || true
  stdlib="$("$ENV_DIR/bin/python" -c 'import sys, sysconfig; print(sysconfig.get_paths()["stdlib"] if sys.pycache_prefix else "")')" || stdlib=""
  if [ -n "$stdlib" ]; then
    "$ENV_DIR/bin/python" -m compileall -q -j 0 -x '/(site-packages|test|idlelib|tkinter|turtledemo)/' "$stdlib" >/dev/null 2>&1 || true
  fi
  touch "$ENV_DIR/.nemo_tau2_bytecode"
}
