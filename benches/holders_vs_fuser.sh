#!/usr/bin/env bash
# holders() against `fuser -v` on the same device files and the same process table: 2,000
# processes with ~50 fds each, and a few simulated holders among them. Needs hyperfine
# (installed with apt-get if missing). Writes benches/results/holders_vs_fuser.json.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000} K=${K:-50}
command -v hyperfine >/dev/null || { apt-get update -qq && apt-get install -y -qq hyperfine >/dev/null; }
cargo build --release -q
BIN=$PWD/target/release/gpuloop
export GPULOOP_SIM=8x80G GPULOOP_SIM_DIR=$(mktemp -d)
table_pid=""; holder_pids=()
cleanup() {
  [ -n "$table_pid" ] && kill -TERM "$table_pid" 2>/dev/null && wait "$table_pid" 2>/dev/null
  for p in "${holder_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$GPULOOP_SIM_DIR"
}
trap cleanup EXIT
for g in 0 3 5; do holder_pids+=($($BIN sim hold --gpu $g --mib 1000)); done
holder_pids+=($($BIN sim hold --gpu 1 --mib 500 --workers 2))
holder_pids+=($($BIN sim hold --gpu 2 --observer))
python3 benches/proctable.py "$N" "$K" "$GPULOOP_SIM_DIR/table.pids" & table_pid=$!
while [ ! -f "$GPULOOP_SIM_DIR/table.pids" ]; do sleep 0.1; done
echo "processes: $(ls /proc | grep -c '^[0-9]')  holders: ${#holder_pids[@]}"
nodes=$(ls "$GPULOOP_SIM_DIR"/dev/nvidia*)
mkdir -p benches/results
hyperfine -N --warmup 3 --runs 40 \
  -n "gpuloop holders --all" "$BIN holders --all" \
  -n "fuser -v /dev/nvidia*" "fuser -v $nodes" \
  --export-json benches/results/holders_vs_fuser.json
