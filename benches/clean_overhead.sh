#!/usr/bin/env bash
# clean's own cost against one scan (`holders --all`) and fuser, on one process table: N
# `sleep` processes with K fds each (benches/proctable.py), at N = 500, 2,000 and 8,000, on
# the simulator (release_ms=0: the memory comes back as the holder exits, so what is timed is
# gpuloop's work and the holder's exit). Each clean run stops a holder its prepare step
# started (`sim hold`, by pid); nothing else is signalled. The commands compared are timed
# with their trials interleaved (benches/alternate.py: one of each per round), so load that
# comes and goes on a shared machine falls on all of them.
# BEFORE=path/to/an/older/gpuloop adds that binary's clean on the same table.
# Writes benches/results/clean_overhead-N.json (hyperfine's JSON layout, each command's
# "ratio" to the scan's median; PREFIX=path/name for PREFIX-N.json instead).
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-50}
PREFIX=${PREFIX:-benches/results/clean_overhead}
SIZES=${SIZES:-"500 2000 8000"}
[ -n "${BIN:-}" ] || { cargo build --release -q; BIN=$PWD/target/release/gpuloop; }
q() { printf '%q ' "$@"; }
export GPULOOP_SIM=8x80G GPULOOP_SIM_DIR=$(mktemp -d)
table_pid=""
cleanup() {
  [ -n "$table_pid" ] && kill -TERM "$table_pid" 2>/dev/null && wait "$table_pid" 2>/dev/null
  "$BIN" sim stop >/dev/null 2>&1 || true
  rm -rf "$GPULOOP_SIM_DIR"
}
trap cleanup EXIT
mkdir -p "$(dirname "$PREFIX")"
# A job on GPUs 1-2 that clean must leave alone, and an observer.
"$BIN" sim hold --gpu 1 --mib 500 --workers 2 >/dev/null
"$BIN" sim hold --gpu 2 --observer >/dev/null
nodes=("$GPULOOP_SIM_DIR"/dev/nvidia[0-9]*)
for N in $SIZES; do
  rm -f "$GPULOOP_SIM_DIR/table.pids"
  python3 benches/proctable.py "$N" "$K" "$GPULOOP_SIM_DIR/table.pids" & table_pid=$!
  while [ ! -f "$GPULOOP_SIM_DIR/table.pids" ]; do sleep 0.1; done
  echo "N=$N: processes: $(ls /proc | grep -c '^[0-9]')"
  # The same table for all of them.
  # BEFORE=another gpuloop binary: its clean beside this one's, on the same table. All in
  # one interleaved run: each round a scan, fuser, and each clean (its prepare step starts
  # the holder it stops), so the ratios to the scan are of one moment's load.
  before=()
  [ -n "${BEFORE:-}" ] && before=(-n "gpuloop clean --gpu 0 (before)" "$(q "$BEFORE" clean --gpu 0)")
  python3 benches/alternate.py --warmup 3 --runs "${RUNS:-30}" \
    -n "gpuloop holders --all" "$(q "$BIN" holders --all)" \
    -n "fuser -v /dev/nvidia*" "$(q fuser -v "${nodes[@]}")" \
    --prepare "$(q "$BIN" sim hold --gpu 0 --mib 1000)" \
    -n "gpuloop clean --gpu 0" "$(q "$BIN" clean --gpu 0)" "${before[@]}" \
    --export-json "$PREFIX-$N.json"
  kill -TERM "$table_pid"; wait "$table_pid" 2>/dev/null || true; table_pid=""
done
