#!/usr/bin/env python3
"""The job of the patch-and-rerun example: a hidden-state extraction.

It "loads the model" on GPUs 0 and 1 as two tensor-parallel workers that hold simulated GPU
memory (`gpuloop sim hold`, each in its own session, like vLLM's workers), runs forward()
of the model library in MODEL_DIR and prints the last layer's hidden states as JSON.
On success it shuts its workers down; when it crashes they are left behind holding the
GPUs, exactly what a crashed multi-GPU job leaves, for the next attempt to clean up.

usage: extract.py MODEL_DIR
"""

import json
import os
import signal
import subprocess
import sys
import time

GPUS = [0, 1]
MIB_PER_WORKER = 6000


def start_workers():
    exe = os.environ.get("GPULOOP_EXE", "gpuloop")
    pids = []
    for gpu in GPUS:
        out = subprocess.run(
            [exe, "sim", "hold", "--gpu", str(gpu), "--mib", str(MIB_PER_WORKER),
             "--setsid", "--name", "tp-worker"],
            check=True, capture_output=True, text=True,
        )
        pids += [int(p) for p in out.stdout.split()]
    return pids


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        # Reaped between the open and the read: gone all the same.
        return True


def stop_workers(pids):
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not all(gone(p) for p in pids):
        if time.monotonic() > deadline:
            sys.exit(f"workers {pids} did not stop")
        time.sleep(0.01)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.path.insert(0, sys.argv[1])
    import model

    workers = start_workers()
    print(f"model loaded on GPUs {GPUS} (workers {workers})", flush=True)
    out = model.forward(["the", "quick", "brown", "fox"], output_hidden_states=True)
    states = out["hidden_states"]
    # As with transformers: the embedding output, then one entry per layer.
    last = states[model.NUM_LAYERS]
    print(json.dumps({"layer": model.NUM_LAYERS, "hidden": last}))
    stop_workers(workers)


if __name__ == "__main__":
    main()
