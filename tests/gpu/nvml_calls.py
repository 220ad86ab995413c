#!/usr/bin/env python3
"""Where an NVML one-shot's time goes: each NVML call timed inside fresh processes (ctypes).

    python3 tests/gpu/nvml_calls.py [--runs 15] > nvml_calls.json

For each way of initialising (`nvmlInit_v2`, `nvmlInitWithFlags(0)`, and
`nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH)`), the median over --runs fresh processes of:
dlopen, init, device count, the first handle of each GPU (the driver attaches it), memory,
ids (uuid + name), utilisation, temperature, compute process count, and nvmlShutdown.
Read-only: it changes nothing on the GPUs. The latency section of benches/results/HISTORY.md quotes it.
"""
import ctypes, json, statistics, subprocess, sys, time

NO_ATTACH = 2


def one(flags):
    t, rc = {}, {}
    mark = time.perf_counter()

    def lap(name):
        nonlocal mark
        now = time.perf_counter()
        t[name] = t.get(name, 0.0) + (now - mark) * 1e3
        mark = now

    lib = ctypes.CDLL("libnvidia-ml.so.1")
    lap("dlopen")
    rc["init"] = lib.nvmlInit_v2() if flags is None else lib.nvmlInitWithFlags(ctypes.c_uint(flags))
    lap("init")
    n = ctypes.c_uint(0)
    rc["count"] = lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
    lap("count")
    for i in range(n.value):
        h = ctypes.c_void_p()
        rc[f"handle{i}"] = lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
        lap("handles")
        if rc[f"handle{i}"] != 0:
            continue
        mem = (ctypes.c_ulonglong * 3)()
        lib.nvmlDeviceGetMemoryInfo(h, mem)
        lap("memory")
        buf = ctypes.create_string_buffer(96)
        lib.nvmlDeviceGetUUID(h, buf, 96)
        lib.nvmlDeviceGetName(h, buf, 96)
        lap("ids")
        util = (ctypes.c_uint * 2)()
        lib.nvmlDeviceGetUtilizationRates(h, util)
        lap("util")
        temp = ctypes.c_uint()
        lib.nvmlDeviceGetTemperature(h, 0, ctypes.byref(temp))
        lap("temp")
        cnt = ctypes.c_uint(0)
        lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), None)
        lap("procs")
    lib.nvmlShutdown()
    lap("shutdown")
    return {"ms": t, "rc": rc, "gpus": n.value}


def main():
    if sys.argv[1:2] == ["--child"]:
        flags = None if sys.argv[2] == "v2" else int(sys.argv[2])
        print(json.dumps(one(flags)))
        return
    runs = int(sys.argv[sys.argv.index("--runs") + 1]) if "--runs" in sys.argv else 15
    out = {}
    for variant, label in (("v2", "nvmlInit_v2"), ("0", "nvmlInitWithFlags(0)"),
                           (str(NO_ATTACH), "nvmlInitWithFlags(NO_ATTACH)")):
        rows = []
        for _ in range(runs):
            p = subprocess.run([sys.executable, __file__, "--child", variant],
                               capture_output=True, text=True)
            if p.returncode != 0:
                out[label] = {"error": f"exit {p.returncode}: {p.stderr[-500:]}"}
                break
            rows.append(json.loads(p.stdout))
        if rows:
            keys = sorted({k for r in rows for k in r["ms"]})
            out[label] = {
                "median_ms": {k: round(statistics.median(r["ms"].get(k, 0.0) for r in rows), 3)
                              for k in keys},
                "gpus": rows[0]["gpus"], "rc": rows[0]["rc"], "runs": len(rows),
            }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
