# Sourced by scripts/setup.sh: run the set-up's parts in lanes, side by side.
#
# Most of a set-up from nothing is waiting on downloads and unpacking (measured 2026-12-03 on the 2-core box: ~13
# minutes, one part after another), so independent parts overlap; parts that depend on each other (SmolLM2's
# conversion runs in the project's environment) or share a lock (apt-get) go in one lane, in order.
#
#   run_lanes LOG_DIR "project smollm2" "chromium sandbox" "vllm" ...
#
# Each lane is a space-separated list of parts; a part runs as `setup_<part>` (dashes as underscores) with errexit on,
# its stdout discarded and its stderr in LOG_DIR/<part>.log. A line says when each part starts and ends (with its
# seconds), and every minute which parts are still running. A part that fails ends its lane (the parts after it in
# that lane are not started) and prints its log's last lines; the other lanes finish, so what they built is cached.
# Returns 1 if any part failed. Ctrl-C or SIGTERM stops every lane with what it started (each lane is a process group
# of its own): an environment left half built has no stamp and is built again from nothing on the next run.

run_lanes() {
  local log_dir="$1"
  shift
  mkdir -p "$log_dir"
  local pids=() lane index=0 started=$SECONDS
  set -m  # each lane a process group of its own, so one signal stops all it started
  trap '_lanes_stop "${pids[@]}"; exit 130' INT
  trap '_lanes_stop "${pids[@]}"; exit 143' TERM
  for lane in "$@"; do
    _lanes_run_one "$log_dir" "$index" "$lane" &
    pids+=("$!")
    index=$((index + 1))
  done
  set +m
  local failed=0 pid next_report=$((SECONDS + 60))
  while :; do
    local running=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running+=("$pid"); done
    [ ${#running[@]} -eq 0 ] && break
    if [ "$SECONDS" -ge "$next_report" ]; then
      log "still running after $((SECONDS - started)) s: $(cat "$log_dir"/lane-*.current 2>/dev/null | tr '\n' ' ')"
      next_report=$((SECONDS + 60))
    fi
    sleep 1
  done
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  trap - INT TERM
  rm -f "$log_dir"/lane-*.current
  return "$failed"
}

_lanes_run_one() {
  local log_dir="$1" index="$2" lane="$3" part part_started status
  set +e
  for part in $lane; do
    echo "$part" >"$log_dir/lane-$index.current"
    log "$part: started (its log: $log_dir/$part.log)"
    part_started=$SECONDS
    (
      set -e
      "setup_${part//-/_}"
    ) >/dev/null 2>"$log_dir/$part.log"
    status=$?
    if [ "$status" -ne 0 ]; then
      log "$part: FAILED (exit $status) after $((SECONDS - part_started)) s; the last lines of $log_dir/$part.log:"
      tail -n 20 "$log_dir/$part.log" | sed "s/^/[setup]   $part| /" >&2
      rm -f "$log_dir/lane-$index.current"
      exit 1
    fi
    log "$part: done in $((SECONDS - part_started)) s"
  done
  rm -f "$log_dir/lane-$index.current"
  exit 0
}

_lanes_stop() {
  local pid
  for pid in "$@"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  for pid in "$@"; do wait "$pid" 2>/dev/null || true; done
  log "stopped: every part still running was ended; rerun scripts/setup.sh to build what is missing"
}
