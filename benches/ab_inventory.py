#!/usr/bin/env python3
"""gpu() and holders() before and after a change, on one machine with real GPUs, interleaved.

    python3 benches/ab_inventory.py BEFORE_BIN AFTER_BIN [ROUNDS] > result.json

A PyTorch process holds 10 GB on GPU 0 for the whole run. Each round runs, for each binary in
turn, one `gpuloop eval` that times 200 calls of gpu() and 50 of holders() in process (means, ms),
then 20 one-shots each of `gpuloop --json gpus` and `gpuloop --json holders` (medians, ms), beside
nvidia-smi and `fuser -v /dev/nvidia*`, the tools a user would run instead. Rounds alternate the
order of the binaries, so a drift of the machine over the run falls on both alike. It signals only
the holder it started. Needs: NVIDIA GPUs, PyTorch, fuser.
"""
import json, os, statistics, subprocess, sys, time

before, after = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5

holder = subprocess.Popen(
    [sys.executable, "-c",
     "import torch, sys, time; x = torch.empty(10**10, dtype=torch.uint8, device='cuda:0'); "
     "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(3600)"],
    stdout=subprocess.PIPE, text=True)
assert holder.stdout.readline().strip() == "ready", "the holder did not start"

LOOP = ("let t = now(); for i in 0..200 { gpu(); } let a = (now() - t) / 200.0; "
        "let t = now(); for i in 0..50 { holders(); } let b = (now() - t) / 50.0; [a * 1000.0, b * 1000.0]")


def run(argv):
    t = time.monotonic()
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return time.monotonic() - t, p


def median_ms(argv, n=20):
    return round(statistics.median(run(argv)[0] for _ in range(n)) * 1000, 2)


def measure(bin_):
    _, p = run([bin_, "eval", LOOP])
    gpu_ms, holders_ms = json.loads(p.stdout)
    return {
        "gpu_ms": round(gpu_ms, 3),
        "holders_ms": round(holders_ms, 3),
        "gpus_cmd_ms": median_ms([bin_, "--json", "gpus"]),
        "holders_cmd_ms": median_ms([bin_, "--json", "holders"]),
    }


out = {"before": [], "after": [], "nvidia_smi_ms": [], "fuser_v_ms": []}
try:
    for r in range(rounds):
        order = [("before", before), ("after", after)]
        for name, b in (order if r % 2 == 0 else order[::-1]):
            out[name].append(measure(b))
        out["nvidia_smi_ms"].append(median_ms(
            ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"]))
        out["fuser_v_ms"].append(median_ms(["bash", "-c", "fuser -v /dev/nvidia* >/dev/null 2>&1"]))
finally:
    holder.kill()
    holder.wait()
for name in ("before", "after"):
    rows = out[name]
    out[name + "_median"] = {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]}
out["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                            stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()
print(json.dumps(out, indent=1))
