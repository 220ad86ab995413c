#!/usr/bin/env bash
# Time to clean on the simulator (driver-like 150 ms release): `gpuloop clean` against the
# one-liner `fuser -k <nodes>; sleep 5; gpuloop gpus` on the same mess (orphaned workers on
# every GPU, an inheriting child, a TERM-ignoring holder), gpuloop's overhead over the release
# itself (from the simulator's release log), and the CPU wait_clean uses while polling.
# Only processes this script starts are signalled (the node files are in its own temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
BIN=$PWD/target/release/gpuloop
RUNS=${RUNS:-10}
export GPULOOP_SIM=8x80G,release_ms=150
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

mess() {
  for g in 0 1 2 3 4 5; do
    local ps=($($BIN sim hold --gpu $g --mib 70000 --workers 1)); pids+=("${ps[@]}")
    kill -KILL "${ps[0]}"   # the launcher dies: its worker is an orphan
  done
  pids+=($($BIN sim hold --gpu 6 --mib 70000 --fork-child --exit-creator))
  pids+=($($BIN sim hold --gpu 7 --mib 70000 --ignore-term))
}

now() { date +%s.%N; }
gl=(); ol=(); over=()
for i in $(seq "$RUNS"); do
  export GPULOOP_SIM_DIR=$(mktemp -d)
  mess
  t0=$(now); $BIN clean --grace 1 >/dev/null; t1=$(now)
  last=$(sort -k2 -n "$GPULOOP_SIM_DIR/released.log" | tail -1 | awk '{print $2}')
  gl+=($(echo "$t1 - $t0" | bc)); over+=($(echo "($t1 - $last) * 1000" | bc))
  rm -rf "$GPULOOP_SIM_DIR"

  export GPULOOP_SIM_DIR=$(mktemp -d)
  mess
  t0=$(now); fuser -k "$GPULOOP_SIM_DIR"/dev/nvidia* >/dev/null 2>&1 || true; sleep 5; $BIN gpus >/dev/null; t1=$(now)
  used=$($BIN --json gpus | python3 -c 'import json,sys; print(sum(g["mem_used_mib"] for g in json.load(sys.stdin)))')
  ol+=("$(echo "$t1 - $t0" | bc)/$used")
  cleanup; pids=()
  rm -rf "$GPULOOP_SIM_DIR"
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
echo "gpuloop clean s: ${gl[*]}"
echo "one-liner s/MiB left: ${ol[*]}"
echo "overhead over the last release ms: ${over[*]}"
g=$(median "${gl[@]}"); o=$(median $(printf '%s\n' "${ol[@]}" | cut -d/ -f1))
echo "median gpuloop clean: $g s; median one-liner: $o s; ratio one-liner/gpuloop: $(echo "scale=1; $o / $g" | bc)"
echo "median overhead over the release: $(median "${over[@]}") ms"

# CPU used by wait_clean while it polls (20 ms) a GPU that never gets clean, for 10 s.
export GPULOOP_SIM_DIR=$(mktemp -d)
$BIN sim leak --gpu 0 --mib 100
/usr/bin/env time -f "%U %S %e" -o "$GPULOOP_SIM_DIR/t" $BIN eval 'wait_clean(0, #{timeout: 10})' >/dev/null 2>&1 || true
read -r u s e < "$GPULOOP_SIM_DIR/t"
echo "wait_clean polling CPU: $(echo "scale=2; ($u + $s) * 100 / $e" | bc)% of a core (user $u s, sys $s s over $e s)"
rm -rf "$GPULOOP_SIM_DIR"
