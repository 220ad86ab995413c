#!/usr/bin/env bash
# Epilog time, gpuloop vs a DeepOps-style epilog (epilog.d/50-exclusive-gpu: list the GPU
# processes, kill -9, sleep 5, check again, drain), on the same mess, on the simulator with the
# driver's 150 ms release delay. Needs a running Slurm (SLURM_CONF) for squeue/scontrol. The
# two epilogs' trials are interleaved (benches/alternate.py; the 5 s one runs fewer times, its
# trials spread over the rounds). The DeepOps-style script lists holders with `fuser` on the simulator's private
# device files (never -k) and kill -9s only those pids: processes this benchmark started.
#
#   SLURM_CONF=/path/slurm.conf bash benches/slurm-epilog.sh [target/release/gpuloop]
set -euo pipefail
BIN=$(realpath "${1:-target/release/gpuloop}")
export GPULOOP_SIM_DIR=$(mktemp -d) GPULOOP_SIM=4x80G,release_ms=150
export SLURM_JOB_ID=812 SLURM_JOB_USER=$(id -un) SLURM_JOB_GPUS=0 SLURMD_NODENAME=$(hostname -s)
trap 'rm -rf "$GPULOOP_SIM_DIR"' EXIT
"$BIN" gpus >/dev/null

cat > "$GPULOOP_SIM_DIR/deepops-epilog.sh" <<SH
#!/usr/bin/env bash
pids=\$(fuser "$GPULOOP_SIM_DIR"/dev/nvidia[0-9]* 2>/dev/null || true)
[ -n "\$pids" ] && kill -9 \$pids
sleep 5
used=\$("$BIN" gpus --json | python3 -c 'import json,sys; print(sum(g["mem_used_mib"] for g in json.load(sys.stdin)))')
if [ "\$used" -ne 0 ]; then
  scontrol update nodename=\$SLURMD_NODENAME state=drain reason="Residual GPU processes found"
  exit 1
fi
SH
chmod +x "$GPULOOP_SIM_DIR/deepops-epilog.sh"

mess="$BIN sim hold --gpu 0 --mib 1000 --setsid >/dev/null"
alt() { python3 "$(dirname "$0")/alternate.py" "$@"; }
echo "== clean node"
alt --warmup 2 --runs 20 "$BIN epilog" --warmup 0 --runs 3 "$GPULOOP_SIM_DIR/deepops-epilog.sh"
echo "== orphaned worker of the job (setsid'd, 1000 MiB on GPU 0)"
alt --prepare "$mess" --runs 20 "$BIN epilog" --runs 3 "$GPULOOP_SIM_DIR/deepops-epilog.sh"
