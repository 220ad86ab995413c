#!/usr/bin/env bash
# clean's own cost against one scan (`holders --all`) and fuser, on one process table: N
# `sleep` processes with K fds each (benches/proctable.py), at N = 500, 2,000 and 8,000, on
# the simulator (release_ms=0: the memory comes back as the holder exits, so what is timed is
# gpuloop's work and the holder's exit). Each clean run stops a holder its prepare step
# started (`sim hold`, by pid); nothing else is signalled. Needs hyperfine (apt-get if missing).
# BEFORE=path/to/an/older/gpuloop adds that binary's clean on the same table.
# Writes benches/results/clean_overhead-{scan,clean}-N.json.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-50}
SIZES=${SIZES:-"500 2000 8000"}
command -v hyperfine >/dev/null || { apt-get update -qq && apt-get install -y -qq hyperfine >/dev/null; }
[ -n "${BIN:-}" ] || { cargo build --release -q; BIN=$PWD/target/release/gpuloop; }
export GPULOOP_SIM=8x80G GPULOOP_SIM_DIR=$(mktemp -d)
table_pid=""
cleanup() {
  [ -n "$table_pid" ] && kill -TERM "$table_pid" 2>/dev/null && wait "$table_pid" 2>/dev/null
  "$BIN" sim stop >/dev/null 2>&1 || true
  rm -rf "$GPULOOP_SIM_DIR"
}
trap cleanup EXIT
mkdir -p benches/results
# A job on GPUs 1-2 that clean must leave alone, and an observer.
"$BIN" sim hold --gpu 1 --mib 500 --workers 2 >/dev/null
"$BIN" sim hold --gpu 2 --observer >/dev/null
nodes=$(ls "$GPULOOP_SIM_DIR"/dev/nvidia[0-9]*)
for N in $SIZES; do
  rm -f "$GPULOOP_SIM_DIR/table.pids"
  python3 benches/proctable.py "$N" "$K" "$GPULOOP_SIM_DIR/table.pids" & table_pid=$!
  while [ ! -f "$GPULOOP_SIM_DIR/table.pids" ]; do sleep 0.1; done
  echo "N=$N: processes: $(ls /proc | grep -c '^[0-9]')"
  # The same table for all three; clean's prepare starts the holder it stops.
  hyperfine -N --warmup 3 --runs ${RUNS:-30} \
    -n "gpuloop holders --all" "$BIN holders --all" \
    -n "fuser -v /dev/nvidia*" "fuser -v $nodes" \
    --export-json "benches/results/clean_overhead-scan-$N.json" | grep -E "^(Benchmark|  Time)"
  # BEFORE=another gpuloop binary: its clean beside this one's, on the same table.
  before=()
  [ -n "${BEFORE:-}" ] && before=(-n "gpuloop clean --gpu 0 (before)" "$BEFORE clean --gpu 0")
  hyperfine -N --warmup 3 --runs ${RUNS:-30} \
    --prepare "$BIN sim hold --gpu 0 --mib 1000" \
    -n "gpuloop clean --gpu 0" "$BIN clean --gpu 0" "${before[@]}" \
    --export-json "benches/results/clean_overhead-clean-$N.json" | grep -E "^(Benchmark|  Time)"
  kill -TERM "$table_pid"; wait "$table_pid" 2>/dev/null || true; table_pid=""
done
