#!/usr/bin/env bash
# The real-GPU scenario suite. On a machine with NVIDIA GPUs and PyTorch, from the repo root:
#   cargo build --release && bash tests/gpu/run.sh [--only inventory,clean-plain,…]
# It kills processes that use the GPUs (the one-liner baseline does `fuser -k /dev/nvidia*`):
# run it only on a machine that is yours for the run. Issue 36's scenarios (a real Xid 31 from
# tests/gpu/xid31.py, ECC and remapped rows against nvidia-smi, reset readiness) never reset a
# GPU: bash tests/gpu/run.sh --only xid31,faults,reset-dry-run
set -uo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
exec timeout 580 python3 tests/gpu/suite.py --bin "${GPULOOP_BIN:-target/release/gpuloop}" "$@"
