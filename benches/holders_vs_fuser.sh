#!/usr/bin/env bash
# holders() against `fuser -v` on the same device files and the same process table: 2,000
# processes with ~50 fds each, and a few holders among them. fuser gets every device file
# gpuloop looks at (each GPU's node, nvidiactl, nvidia-uvm, the MIG capabilities under
# nvidia-caps/), each checked to exist. The trials of the two commands are interleaved
# (benches/alternate.py), so load that comes and goes falls on both. Writes
# benches/results/holders_vs_fuser.json (OUT= another path), hyperfine's JSON layout.
# BIN=path: that gpuloop, not a fresh release build. REAL=1, on a GPU machine that is yours:
# the real driver and /dev/nvidia*, with one real holder (PyTorch, 1 GiB on GPU 0) beside the
# table; otherwise a simulator with 8 GPUs and simulated holders. RUNS (40), N, K.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000} K=${K:-50}
[ -n "${BIN:-}" ] || { cargo build --release -q; BIN=$PWD/target/release/gpuloop; }
OUT=${OUT:-benches/results/holders_vs_fuser.json}
WORK=$(mktemp -d)
table_pid=""; holder_pids=()
cleanup() {
  [ -n "$table_pid" ] && kill -TERM "$table_pid" 2>/dev/null && wait "$table_pid" 2>/dev/null
  for p in "${holder_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
if [ -n "${REAL:-}" ]; then
  python3 -c 'import time, torch; x = torch.empty(2**30, dtype=torch.uint8, device="cuda"); print(flush=True); time.sleep(10**6)' \
    > "$WORK/holder.out" & holder_pids+=($!)
  until [ -s "$WORK/holder.out" ]; do sleep 0.1; done
  dev=/dev
else
  export GPULOOP_SIM=8x80G GPULOOP_SIM_DIR=$WORK/sim
  for g in 0 3 5; do holder_pids+=($($BIN sim hold --gpu $g --mib 1000)); done
  holder_pids+=($($BIN sim hold --gpu 1 --mib 500 --workers 2))
  holder_pids+=($($BIN sim hold --gpu 2 --observer))
  dev=$GPULOOP_SIM_DIR/dev
fi
# The device files themselves: a glob, not `ls`, which lists a directory's entries
# (nvidia-caps/) by their bare names, with a "DIR:" header, names that do not exist here.
# (nullglob: a machine without MIG has no nvidia-caps/, and a pattern that matches nothing
# is no name.)
nodes=()
shopt -s nullglob
for f in "$dev"/nvidia* "$dev"/nvidia-caps/*; do
  [ -d "$f" ] || nodes+=("$f")
done
shopt -u nullglob
for f in "${nodes[@]}"; do
  [ -e "$f" ] || { echo "holders_vs_fuser.sh: $f does not exist" >&2; exit 1; }
done
[ ${#nodes[@]} -gt 0 ] || { echo "holders_vs_fuser.sh: no device files under $dev" >&2; exit 1; }
echo "device files for fuser: ${nodes[*]}"
python3 benches/proctable.py "$N" "$K" "$WORK/table.pids" & table_pid=$!
while [ ! -f "$WORK/table.pids" ]; do sleep 0.1; done
echo "processes: $(ls /proc | grep -c '^[0-9]')  cores: $(nproc)  holders started: ${#holder_pids[@]}"
"$BIN" holders --all | head -12 || true
mkdir -p "$(dirname "$OUT")"
python3 benches/alternate.py --warmup 3 --runs "${RUNS:-40}" \
  -n "gpuloop holders --all" "$(printf '%q ' "$BIN" holders --all)" \
  -n "fuser -v /dev/nvidia*" "$(printf '%q ' fuser -v "${nodes[@]}")" \
  --export-json "$OUT"
