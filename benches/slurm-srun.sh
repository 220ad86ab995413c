#!/usr/bin/env bash
# --transport srun: one `gpuloop --hosts-from-slurm J --transport srun gpus` (two scontrol
# calls, one step, the agent's hello, one call, the step's end), side by side with what a user
# would type instead on a cluster without ssh to the nodes: a one-shot in a step of the job
# (`srun --overlap --jobid J -w NODE gpuloop gpus`, as one would run nvidia-smi there), and a
# bare step (`… true`), the floor, their trials interleaved (benches/alternate.py). Needs a
# running Slurm (SLURM_CONF) with this machine as a node; on the simulator. The job it submits is cancelled at exit.
#
#   SLURM_CONF=/path/slurm.conf bash benches/slurm-srun.sh [target/release/gpuloop]
set -euo pipefail
BIN=$(realpath "${1:-target/release/gpuloop}")
export GPULOOP_SIM_DIR=$(mktemp -d) GPULOOP_SIM=4x80G
unset SLURM_JOB_ID
job=$(sbatch --parsable -c 1 --output=/dev/null --wrap 'sleep 600')
trap 'scancel "$job"; rm -rf "$GPULOOP_SIM_DIR"' EXIT
until [ "$(squeue -h -j "$job" -o %T)" = RUNNING ]; do sleep 0.2; done
node=$(squeue -h -j "$job" -o %N)
step="srun --jobid $job --nodelist $node --nodes=1 --ntasks=1 --overlap --mpi=none"
"$BIN" gpus >/dev/null

python3 "$(dirname "$0")/alternate.py" --warmup 2 --runs 20 \
  "$step true" \
  "$step $BIN gpus" \
  "$BIN --hosts-from-slurm $job --transport srun --remote-bin $BIN gpus"
