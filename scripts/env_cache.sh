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

env_cache_reuse_or_lock() {
  mkdir -p "$(dirname "$ENV_DIR")"
  exec 9>"$ENV_DIR.lock"
  flock 9
  local check=imports_ok
  declare -F reuse_ok >/dev/null && check=reuse_ok
  if [ -f "$ENV_DIR/.nemo_tau2_stamp" ] && [ "$(cat "$ENV_DIR/.nemo_tau2_stamp")" = "$STAMP" ] && "$check"; then
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
  echo "$STAMP" > "$ENV_DIR/.nemo_tau2_stamp"
  log "ready: $ENV_DIR"
  echo "$ENV_DIR/bin/python"
}
