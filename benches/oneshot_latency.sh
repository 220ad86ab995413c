#!/usr/bin/env bash
# gpuloop's own share of a one-shot's latency, without a GPU: `--version`, `gpus --json` and
# `holders --json` on the fake driver library of the tests (tests/fake_nvml), with hyperfine.
#
#   benches/oneshot_latency.sh [BIN…]        (default: target/release/gpuloop)
#
# Two rounds: the fake driver answering at once (the whole run is gpuloop's own overhead),
# then with the driver's costs as measured on H200s added (FAKE_NVML_DELAY, default
# init=10,attach=6,util=2 ms: nvmlInit, each GPU's first handle, its first utilisation read),
# where the floor is what the critical path must wait for: init + attach (+ util for gpus).
# Several binaries (before/after) are measured side by side in each round, twice, in
# alternating order, so that a busy machine's drift shows. Medians (ms) go to stdout;
# hyperfine's JSON to $OUT (default a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v hyperfine >/dev/null || { echo "hyperfine is needed (apt-get install hyperfine)" >&2; exit 1; }
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
  local name=$1 order=$2 cmds=() b
  local list=("${bins[@]}")
  if [ "$order" = rev ]; then
    list=(); for ((i=${#bins[@]}-1; i>=0; i--)); do list+=("${bins[$i]}"); done
  fi
  for b in "${list[@]}"; do
    cmds+=("$b --version" "$b gpus --json" "$b holders --json")
  done
  hyperfine -N --warmup 5 --runs "$runs" --export-json "$out/$name-$order.json" "${cmds[@]}" >/dev/null 2>&1
  python3 - "$out/$name-$order.json" "$name ($order)" <<'EOF'
import json, sys
rs = json.load(open(sys.argv[1]))["results"]
print(f"-- {sys.argv[2]}")
for r in rs:
    ms = sorted(t * 1e3 for t in r["times"])
    print(f"  {r['command']:<60} median {r['median']*1e3:6.2f}  min {ms[0]:6.2f}  p25 {ms[len(ms)//4]:6.2f}")
EOF
}

unset FAKE_NVML_DELAY_MS
round fast fwd
round fast rev
export FAKE_NVML_DELAY_MS=${FAKE_NVML_DELAY:-init=10,attach=6,util=2}
echo "FAKE_NVML_DELAY_MS=$FAKE_NVML_DELAY_MS"
round delayed fwd
round delayed rev
echo "hyperfine JSON in $out"
