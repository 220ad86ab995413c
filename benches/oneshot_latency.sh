#!/usr/bin/env bash
# gpuloop's own share of a one-shot's latency, without a GPU: `--version`, `gpus --json` and
# `holders --json` on the fake driver library of the tests (tests/fake_nvml).
#
#   benches/oneshot_latency.sh [BIN…]        (default: target/release/gpuloop)
#
# Two rounds: the fake driver answering at once (the whole run is gpuloop's own overhead),
# then with the driver's costs as measured on H200s added (FAKE_NVML_DELAY, default
# init=10,attach=6,util=2 ms: nvmlInit, each GPU's first handle, its first utilisation read),
# where the floor is what the critical path must wait for: init + attach (+ util for gpus).
# Several binaries (before/after) are measured side by side in each round, their trials
# interleaved (benches/alternate.py: one trial of each command per round, every other round
# backward), so that a busy machine's drift falls on all alike. Medians (ms) go to stdout;
# the JSON (hyperfine's layout) to $OUT (default a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/gpuloop)
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
runs=${RUNS:-100}
lib="$out/libfake-nvml.so"
cc -O2 -shared -fPIC -o "$lib" tests/fake_nvml/fake_nvml.c
export GPULOOP_NVML_LIB="$lib" NO_COLOR=1
unset GPULOOP_SIM GPULOOP_SIM_DIR FAKE_NVML
echo "$(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg); $runs runs each"

round() {
  local name=$1 cmds=() b
  for b in "${bins[@]}"; do
    cmds+=("$b --version" "$b gpus --json" "$b holders --json")
  done
  python3 benches/alternate.py --quiet --warmup 5 --runs "$runs" --export-json "$out/$name.json" "${cmds[@]}"
  python3 - "$out/$name.json" "$name" <<'EOF'
import json, sys
rs = json.load(open(sys.argv[1]))["results"]
print(f"-- {sys.argv[2]}")
for r in rs:
    ms = sorted(t * 1e3 for t in r["times"])
    print(f"  {r['command']:<60} median {r['median']*1e3:6.2f}  min {ms[0]:6.2f}  p25 {ms[len(ms)//4]:6.2f}")
EOF
}

unset FAKE_NVML_DELAY_MS
round fast
export FAKE_NVML_DELAY_MS=${FAKE_NVML_DELAY:-init=10,attach=6,util=2}
echo "FAKE_NVML_DELAY_MS=$FAKE_NVML_DELAY_MS"
round delayed
echo "JSON in $out"
