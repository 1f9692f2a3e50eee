#!/usr/bin/env bash
# Prepare the GPU kit: the wheels bench/gpu_check.py needs beyond a bare GPU machine's torch stack.
#
#   scripts/gpu_kit.sh [DEST]     # default DEST: gpu_kit_wheels/ at the repository root (git-ignored)
#
# Downloads scripts/gpu_kit_requirements.txt for CPython 3.12 on manylinux x86-64 (binary wheels only, no
# dependencies resolved: the list is complete, tests/unit/test_gpu_kit.py checks it), fails if the folder holds more
# than 20 MiB (a GPU loan carries 64 MiB at most, the repository included), and stamps the checkout's commit into
# the folder (COMMIT; only when the repository root is the top of its own git checkout) for the check's record.
# Documented in docs/gpu-kit.md.
#
# The kit, as typed (tests/unit/test_gpu_kit.py runs these lines, the last with --dry-run, in a virtual environment
# holding only a GPU machine's packages):
# here, in the checkout:
#   scripts/gpu_kit.sh
# then carry the repository with gpu_kit_wheels/ to the GPU machine, and there, at its root:
#   pip install --no-index --no-deps --target /tmp/gpu_kit gpu_kit_wheels/*.whl
#   PYTHONPATH=/tmp/gpu_kit:$PWD python bench/gpu_check.py --out gpu_check.jsonl --write-calibration calibration.json
#
# (--no-deps: the machine's torch stack is already there, and pip would resolve megatron-core's torch requirement
# against the empty index and fail.) The last line printed is the folder.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
DEST="${1:-$ROOT/gpu_kit_wheels}"
MAX_BYTES=$((20 * 1024 * 1024))
PYTHON="${PYTHON:-python3}"
log() { echo "[gpu_kit] $*" >&2; }

if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  log "error: $PYTHON has no pip: set PYTHON to an interpreter with pip (any version; the wheels are for 3.12)"
  exit 2
fi
rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --only-binary=:all: --no-deps --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 \
  --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
  -r "$HERE/gpu_kit_requirements.txt" -d "$DEST" >&2

wanted="$(grep -c '^[A-Za-z]' "$HERE/gpu_kit_requirements.txt")"
got="$(find "$DEST" -name '*.whl' | wc -l)"
if [ "$got" -ne "$wanted" ]; then
  log "error: $got wheels in $DEST for $wanted requirements"
  exit 1
fi
bytes="$(du -sb "$DEST" | cut -f1)"
if [ "$bytes" -gt "$MAX_BYTES" ]; then
  log "error: $DEST holds $bytes bytes, more than 20 MiB ($MAX_BYTES): the kit must stay small enough to carry"
  exit 1
fi
# The commit, only when ROOT is the top of its own checkout: a copy inside another checkout would get that one's.
if [ "$(git -C "$ROOT" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$ROOT" && pwd -P)" ]; then
  git -C "$ROOT" rev-parse --short HEAD > "$DEST/COMMIT"
else
  log "warning: $ROOT is not the top of its own git checkout: no commit stamped (the record will say unknown)"
fi
log "$got wheels, $bytes bytes (limit $MAX_BYTES) in $DEST"
echo "$DEST"
