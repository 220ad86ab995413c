#!/usr/bin/env python3
"""Can a one-shot read GPU memory without paying the driver's attach? (issue 11, item 9)

    python3 tests/gpu/nvml_attach.py OUT.json [--runs 15] [--bin target/release/gpuloop]

Each variant runs in --runs fresh processes (ctypes, like nvml_calls.py); per step the median
time (ms) and the return codes NVML gave. Variants:
  - index:               nvmlInit_v2, handles by index (the way gpuloop does it today)
  - index_threads:       nvmlInit_v2, each GPU's handle on a thread of its own
  - index_warm:          gpuloop's way: a thread per GPU starts its attach right after init
                         while the reader asks for the same handles (attached once or twice?)
  - init2_index:         two threads call nvmlInit_v2 at once (safe, and as fast as one?)
  - busid / uuid:        nvmlInit_v2, handles by PCI bus id (_v2) / by UUID
  - noattach_busid / noattach_uuid / noattach_index:
                         nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH), then handles by bus id,
                         UUID or index: does a handle got that way read memory, and faster?
  - noattach_busid_threads: the same, one thread per GPU
Bus ids and UUIDs come from /proc/driver/nvidia/gpus/*/information, not from NVML.
After the handle, per GPU: nvmlDeviceGetMemoryInfo (v1) and nvmlDeviceGetMemoryInfo_v2, each
twice; nvmlDeviceGetUtilizationRates three times (is only the first call slow, and is it per
GPU?); temperature twice; the compute-process count twice.
In the index variant, after the reads: dlsym of every nvml* name in the library (what
nvml-wrapper does before nvmlInit: it resolves ~400 symbols) and a second nvmlInit_v2.
Also: the cost of a process's exit after NVML (the kernel closing the driver's fds, which a
one-shot's caller waits for), with and without nvmlShutdown, against a process that never
loaded NVML; and, where strace exists, `strace -f -tt -T` of one `gpuloop gpus --json` and one
`gpuloop holders --json` (files beside OUT.json), plus gpuloop's own `-v` timeline of a few runs.
Read-only: it changes nothing on the GPUs.
"""
import ctypes, glob, json, os, shutil, statistics, subprocess, sys, threading, time

NO_ATTACH = 2
LIB = os.environ.get("NVML_LIB", "libnvidia-ml.so.1")  # another file only to try the script


def proc_gpus():
    """(bus id, uuid, minor) of each GPU, from the driver's /proc files, in bus order."""
    out = []
    for d in sorted(glob.glob("/proc/driver/nvidia/gpus/*")):
        info = {}
        try:
            with open(os.path.join(d, "information")) as f:
                for line in f:
                    k, _, v = line.partition(":")
                    info[k.strip()] = v.strip()
        except OSError:
            pass
        out.append({"bus_id": os.path.basename(d), "uuid": info.get("GPU UUID", ""),
                    "minor": info.get("Device Minor", "")})
    return out


def nvml_names():
    """The nvml* names in the loaded library's file (its exports, and a few strings)."""
    import re
    with open("/proc/self/maps") as f:
        path = next((l.split()[-1] for l in f if "nvidia-ml" in l or LIB in l), None)
    if not path:
        return []
    with open(path, "rb") as f:
        return sorted(set(re.findall(rb"nvml[A-Za-z0-9_]+", f.read())))


class Clock:
    def __init__(self):
        self.t, self.rc = {}, {}
        self.mark = time.perf_counter()

    def lap(self, name, rc=None):
        now = time.perf_counter()
        self.t[name] = self.t.get(name, 0.0) + (now - self.mark) * 1e3
        self.mark = now
        if rc is not None:
            self.rc[name] = rc


def handle_of(lib, how, i, g):
    h = ctypes.c_void_p()
    if how == "index":
        rc = lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(i), ctypes.byref(h))
    elif how == "busid":
        rc = lib.nvmlDeviceGetHandleByPciBusId_v2(g["bus_id"].encode(), ctypes.byref(h))
        if rc != 0 and len(g["bus_id"].split(":")[0]) == 4:
            # NVML writes the domain with 8 digits; try that spelling too.
            rc = lib.nvmlDeviceGetHandleByPciBusId_v2(("0000" + g["bus_id"]).encode(),
                                                      ctypes.byref(h))
    else:
        rc = lib.nvmlDeviceGetHandleByUUID(g["uuid"].encode(), ctypes.byref(h))
    return rc, h


def reads(lib, c, i, h):
    mem1 = (ctypes.c_ulonglong * 3)()
    for k in (1, 2):
        c.lap(f"gpu{i}.memory_v1#{k}", lib.nvmlDeviceGetMemoryInfo(h, mem1))
        mem2 = (ctypes.c_ulonglong * 5)()
        ctypes.cast(mem2, ctypes.POINTER(ctypes.c_uint))[0] = 40 | (2 << 24)
        c.lap(f"gpu{i}.memory_v2#{k}", lib.nvmlDeviceGetMemoryInfo_v2(h, mem2))
    util = (ctypes.c_uint * 2)()
    for k in (1, 2, 3):
        c.lap(f"gpu{i}.util#{k}", lib.nvmlDeviceGetUtilizationRates(h, util))
    temp = ctypes.c_uint()
    for k in (1, 2):
        c.lap(f"gpu{i}.temp#{k}", lib.nvmlDeviceGetTemperature(h, 0, ctypes.byref(temp)))
    cnt = ctypes.c_uint(0)
    for k in (1, 2):
        cnt.value = 0
        c.lap(f"gpu{i}.procs#{k}", lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(cnt), None))
    return mem1[2]


def child(variant):
    c = Clock()
    gpus = proc_gpus()
    c.lap("proc_files")
    lib = ctypes.CDLL(LIB)
    c.lap("dlopen")
    noattach = variant.startswith("noattach_")
    how = variant.replace("noattach_", "").replace("_threads", "")
    threads = variant.endswith("_threads")
    if variant == "init2_index":
        # Two threads initialise at once (would overlapping nvml-wrapper's symbol lookup with
        # a bare nvmlInit_v2 on another thread be safe and free?).
        rcs = []
        ts = [threading.Thread(target=lambda: rcs.append(lib.nvmlInit_v2())) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        c.lap("init", max(rcs))
        how = "index"
    else:
        c.lap("init", lib.nvmlInitWithFlags(ctypes.c_uint(NO_ATTACH)) if noattach else lib.nvmlInit_v2())
    n = ctypes.c_uint(0)
    c.lap("count", lib.nvmlDeviceGetCount_v2(ctypes.byref(n)))
    if not gpus:
        # No /proc/driver/nvidia here: the index variants still run (bus ids and UUIDs fail).
        gpus = [{"bus_id": "", "uuid": "", "minor": ""} for _ in range(n.value)]
    handles = {}
    if variant == "index_warm":
        # gpuloop's way since round 4: one thread per GPU starts the attach right after init,
        # and the reader asks for the same handles at once (does the driver attach each GPU
        # once, the reader waiting for it, or twice?).
        ws = [threading.Thread(target=handle_of, args=(lib, "index", i, g))
              for i, g in enumerate(gpus)]
        for t in ws:
            t.start()
        for i, g in enumerate(gpus):
            rc, h = handle_of(lib, "index", i, g)
            c.lap(f"gpu{i}.handle", rc)
            if rc == 0:
                handles[i] = h
        c.t["handles_wall"] = sum(c.t.get(f"gpu{i}.handle", 0.0) for i in range(len(gpus)))
        for t in ws:
            t.join()
        c.lap("warm_join")
    elif threads:
        res = {}

        def get(i, g):
            t = time.perf_counter()
            rc, h = handle_of(lib, how, i, g)
            res[i] = (rc, h, (time.perf_counter() - t) * 1e3)
        ts = [threading.Thread(target=get, args=(i, g)) for i, g in enumerate(gpus)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        c.lap("handles_wall")
        for i in sorted(res):
            rc, h, ms = res[i]
            c.t[f"gpu{i}.handle"] = ms
            c.rc[f"gpu{i}.handle"] = rc
            if rc == 0:
                handles[i] = h
    else:
        for i, g in enumerate(gpus):
            rc, h = handle_of(lib, how, i, g)
            c.lap(f"gpu{i}.handle", rc)
            if rc == 0:
                handles[i] = h
        c.t["handles_wall"] = sum(c.t.get(f"gpu{i}.handle", 0.0) for i in range(len(gpus)))
    used = {}
    for i, h in sorted(handles.items()):
        used[i] = reads(lib, c, i, h)
    if variant == "index":
        # What nvml-wrapper adds before gpuloop's attaches can start: resolving every NVML
        # symbol (dlsym of each name the library exports) and, were gpuloop to call a bare
        # nvmlInit_v2 first, a second (reference-counted) nvmlInit_v2.
        c.lap("reads_done")
        c.lap("init_again", lib.nvmlInit_v2())
        names = nvml_names()
        dlsym = ctypes.CDLL(None).dlsym
        dlsym.restype, dlsym.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
        found = sum(1 for nm in names if dlsym(lib._handle, nm))
        c.lap("dlsym_all")
        c.rc["dlsym_all"] = f"{found} of {len(names)} names"
        # The same number of ctypes calls to a C function that does nothing much: subtract it
        # from dlsym_all for the lookups alone.
        nop = ctypes.CDLL(None).dlerror
        for _ in names:
            nop()
        c.lap("ctypes_calls_baseline")
    return {"ms": c.t, "rc": c.rc, "nvml_count": n.value, "proc_gpus": len(gpus),
            "mem_used": used}


def exit_child(mode):
    """Prints a mark when its work is done, then exits at once (os._exit: no interpreter
    teardown); the parent times mark -> reaped."""
    if mode != "no_nvml":
        lib = ctypes.CDLL(LIB)
        lib.nvmlInit_v2()
        n = ctypes.c_uint(0)
        lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
        for i in range(n.value):
            h = ctypes.c_void_p()
            lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
            mem = (ctypes.c_ulonglong * 3)()
            lib.nvmlDeviceGetMemoryInfo(h, mem)
        if mode == "shutdown":
            t = time.perf_counter()
            lib.nvmlShutdown()
            sys.stderr.write("%.6f\n" % (time.perf_counter() - t))
    os.write(1, b"done\n")
    os._exit(0)


def median_of(rows, key):
    keys = sorted({k for r in rows for k in r[key]})
    return {k: round(statistics.median(r[key][k] for r in rows if k in r[key]), 3) for k in keys}


def exit_costs(runs):
    out = {}
    for mode in ("no_nvml", "no_shutdown", "shutdown"):
        exits, shut = [], []
        for _ in range(runs):
            p = subprocess.Popen([sys.executable, __file__, "--exit-child", mode],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            p.stdout.readline()
            t = time.perf_counter()
            p.wait()
            exits.append((time.perf_counter() - t) * 1e3)
            err = p.stderr.read().split()
            if err:
                shut.append(float(err[0]) * 1e3)
        out[mode] = {"exit_ms": round(statistics.median(exits), 3)}
        if shut:
            out[mode]["nvmlShutdown_ms"] = round(statistics.median(shut), 3)
    return out


def gpuloop_runs(binary, outdir):
    res = {}
    if not os.path.exists(binary):
        return {"error": f"{binary} not found (cargo build --release)"}
    env = dict(os.environ)
    env.pop("GPULOOP_SIM", None)
    env.pop("GPULOOP_SIM_DIR", None)
    for args in (["gpus", "--json"], ["holders", "--json"]):
        key = " ".join(args)
        lines = []
        for _ in range(5):
            p = subprocess.run([binary, "-v", *args], env=env, capture_output=True, text=True)
            lines.append([l for l in p.stderr.splitlines() if "DEBUG" in l])
        res[key] = {"verbose": lines}
        if shutil.which("strace"):
            path = os.path.join(outdir, "strace-" + args[0] + ".txt")
            subprocess.run(["strace", "-f", "-tt", "-T", "-o", path, binary, *args], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            res[key]["strace"] = path
            summary = os.path.join(outdir, "strace-c-" + args[0] + ".txt")
            subprocess.run(["strace", "-f", "-c", "-o", summary, binary, *args], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            res[key]["strace_c"] = summary
    res["strace"] = shutil.which("strace") or "not installed"
    return res


VARIANTS = ("index", "index_threads", "index_warm", "init2_index", "busid", "uuid",
            "noattach_index", "noattach_busid", "noattach_uuid", "noattach_busid_threads")


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2])))
        return
    if sys.argv[1:2] == ["--exit-child"]:
        exit_child(sys.argv[2])
        return
    argv = sys.argv[1:]
    if not argv or argv[0].startswith("-"):
        sys.exit("usage: nvml_attach.py OUT.json [--runs N] [--bin PATH]")
    out_path = os.path.abspath(argv.pop(0))
    runs, binary = 15, "target/release/gpuloop"
    while argv:
        a = argv.pop(0)
        if a == "--runs":
            runs = int(argv.pop(0))
        elif a == "--bin":
            binary = argv.pop(0)
    outdir = os.path.dirname(out_path)
    os.makedirs(outdir, exist_ok=True)
    res = {"proc_gpus": proc_gpus(), "runs": runs, "variants": {}}
    for v in VARIANTS:
        rows, err = [], None
        for _ in range(runs):
            p = subprocess.run([sys.executable, __file__, "--child", v], capture_output=True,
                               text=True)
            if p.returncode != 0:
                err = f"exit {p.returncode}: {p.stderr[-800:]}"
                break
            rows.append(json.loads(p.stdout))
        entry = {"median_ms": median_of(rows, "ms"), "rc": rows[0]["rc"],
                 "nvml_count": rows[0]["nvml_count"], "mem_used": rows[0]["mem_used"]} if rows else {}
        if err:
            entry["error"] = err
        res["variants"][v] = entry
        print(v, json.dumps({k: entry["median_ms"][k] for k in ("init", "handles_wall")
                             if k in entry.get("median_ms", {})}), flush=True)
    res["exit"] = exit_costs(runs)
    print("exit", json.dumps(res["exit"]), flush=True)
    res["gpuloop"] = gpuloop_runs(os.path.abspath(binary), outdir)
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
