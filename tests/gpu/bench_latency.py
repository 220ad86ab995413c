"""One-shot latency on a GPU machine (issue 11, item 9): gpuloop's one-shots side by side with
the tools people use instead, and where gpuloop's time goes.

    python3 tests/gpu/bench_latency.py [--bin target/release/gpuloop] [--runs 31] [--out DIR]

One command on the GPU machine, from the repo root (it needs PyTorch for the holder round):
    cargo build --release && python3 tests/gpu/bench_latency.py --runs 31 --out "$OUT/latency"

Measures, each as the median (and p10/p90) of --runs fresh processes (at least 21):
  - `gpuloop gpus --json`            vs `nvidia-smi --query-gpu=index,memory.used --format=csv,noheader`
                                       and vs nvidia-smi asked for the fields gpus reports
                                       (uuid, name, bus id, memory, utilization, temperature)
  - `gpuloop holders --json`         vs `fuser -v /dev/nvidia*`
  - a bare `nvmlInit_v2` (ctypes, timed inside a fresh Python process, dlopen excluded) and
    dlopen + nvmlInit_v2 + nvmlShutdown together
  - the NVML floor: dlopen + nvmlInit_v2 + a handle and the memory of every GPU, timed inside
    one Python process: the least any NVML tool pays to read memory (a GPU's first handle
    attaches it in the driver, ~7 ms on an H200, and the driver attaches GPUs one at a time)
  - `gpuloop --version` (the process start-up floor)
once with idle GPUs and once with a PyTorch holder on GPU 0 (mess.py plain, 2 GB). It also
records gpuloop's own breakdown (`-v`: NVML load+init, per-query times, the /proc scan beside
it) and, where hyperfine is installed, hyperfine's JSON for the same commands.

Targets (issue 11): gpus <= 0.8 x nvidia-smi; holders <= nvmlInit_v2 + 10 ms.
Writes latency.json and latency.md to --out (default $OUT or .). Read-only: it kills nothing
but the holder it started.
"""
import json, os, shutil, signal, statistics, subprocess, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN, RUNS, OUT = "target/release/gpuloop", 31, os.environ.get("OUT", ".")
argv = sys.argv[1:]
while argv:
    a = argv.pop(0)
    if a == "--bin":
        BIN = argv.pop(0)
    elif a == "--runs":
        RUNS = max(21, int(argv.pop(0)))
    elif a == "--out":
        OUT = argv.pop(0)
BIN = os.path.abspath(BIN)
ENV = dict(os.environ)
ENV.pop("GPULOOP_SIM", None)
ENV.pop("GPULOOP_SIM_DIR", None)
NODES = sorted(os.path.join("/dev", n) for n in os.listdir("/dev") if n.startswith("nvidia"))

INIT_ONLY = r'''
import ctypes, time, sys
lib = ctypes.CDLL("libnvidia-ml.so.1")
t = time.perf_counter(); rc = lib.nvmlInit_v2(); dt = time.perf_counter() - t
lib.nvmlShutdown()
print("%d %.6f" % (rc, dt))
'''
LOAD_INIT = r'''
import ctypes, time
t = time.perf_counter()
lib = ctypes.CDLL("libnvidia-ml.so.1"); rc = lib.nvmlInit_v2(); lib.nvmlShutdown()
print("%d %.6f" % (rc, time.perf_counter() - t))
'''

FLOOR = r'''
import ctypes, time
t = time.perf_counter()
lib = ctypes.CDLL("libnvidia-ml.so.1"); rc = lib.nvmlInit_v2()
n = ctypes.c_uint(0); rc = rc or lib.nvmlDeviceGetCount_v2(ctypes.byref(n))
for i in range(n.value):
    h = ctypes.c_void_p(); rc = rc or lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h))
    mem = (ctypes.c_ulonglong * 3)(); rc = rc or lib.nvmlDeviceGetMemoryInfo(h, mem)
print("%d %.6f" % (rc, time.perf_counter() - t))
'''
SMI_SAME = ["nvidia-smi", "--query-gpu=index,uuid,name,pci.bus_id,memory.total,memory.used,"
            "utilization.gpu,temperature.gpu", "--format=csv,noheader"]


def wall(cmd, shell=False):
    """Wall time of one fresh process, output discarded; (seconds, exit code)."""
    t = time.perf_counter()
    p = subprocess.run(cmd, shell=shell, env=ENV, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return time.perf_counter() - t, p.returncode


def stats(samples_s):
    ms = sorted(x * 1000 for x in samples_s)
    q = lambda f: ms[min(len(ms) - 1, int(f * len(ms)))]
    return dict(median_ms=round(statistics.median(ms), 3), p10_ms=round(q(0.1), 3),
                p90_ms=round(q(0.9), 3), runs=len(ms))


def bench(name, cmd, shell=False):
    wall(cmd, shell)  # warm the page cache and the driver once
    samples, codes = [], set()
    for _ in range(RUNS):
        dt, rc = wall(cmd, shell)
        samples.append(dt)
        codes.add(rc)
    r = dict(stats(samples), cmd=cmd if isinstance(cmd, str) else " ".join(cmd),
             exit_codes=sorted(codes))
    print(f"  {name:<22} median {r['median_ms']:8.2f} ms  (p10 {r['p10_ms']:.2f}, p90 {r['p90_ms']:.2f})",
          flush=True)
    return r


def inner(code):
    """Times measured inside fresh Python processes (interpreter start-up excluded)."""
    out = []
    for _ in range(RUNS):
        p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True)
        rc, dt = p.stdout.split()
        if rc != "0":
            raise RuntimeError(f"NVML returned {rc}")
        out.append(float(dt))
    return stats(out)


def breakdown():
    """gpuloop -v's own account of a few runs: the debug lines, as printed."""
    lines = {}
    for args in (["gpus", "--json"], ["holders", "--json"]):
        p = subprocess.run([BIN, "-v", *args], env=ENV, capture_output=True, text=True)
        lines[" ".join(args)] = [l for l in p.stderr.splitlines()
                                 if "nvml" in l or "inventory" in l or "done at" in l]
    return lines


def hyperfine(cmds):
    if not shutil.which("hyperfine"):
        return "hyperfine not installed: skipped (the Python medians above are the figures)"
    path = os.path.join(OUT, "hyperfine.json")
    subprocess.run(["hyperfine", "-N", "--warmup", "3", "--runs", str(RUNS), "--export-json", path,
                    *cmds], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(path) as f:
        return [dict(cmd=r["command"], median_ms=round(r["median"] * 1000, 3))
                for r in json.load(f)["results"]]


def round_of(label):
    print(f"-- {label}", flush=True)
    r = dict(
        gpuloop_version=bench("gpuloop --version", [BIN, "--version"]),
        gpuloop_gpus=bench("gpuloop gpus --json", [BIN, "gpus", "--json"]),
        nvidia_smi=bench("nvidia-smi --query-gpu", ["nvidia-smi", "--query-gpu=index,memory.used",
                                                    "--format=csv,noheader"]),
        nvidia_smi_same_fields=bench("nvidia-smi, gpus' fields", SMI_SAME),
        gpuloop_holders=bench("gpuloop holders --json", [BIN, "holders", "--json"]),
        fuser_v=bench("fuser -v /dev/nvidia*", ["fuser", "-v", *NODES]),
    )
    r["nvml_init"] = inner(INIT_ONLY)
    r["nvml_load_init_shutdown"] = inner(LOAD_INIT)
    r["nvml_floor"] = inner(FLOOR)
    print(f"  {'nvmlInit_v2 (ctypes)':<22} median {r['nvml_init']['median_ms']:8.2f} ms; "
          f"dlopen+init+shutdown {r['nvml_load_init_shutdown']['median_ms']:.2f} ms; "
          f"floor (dlopen+init+handles+memory) {r['nvml_floor']['median_ms']:.2f} ms", flush=True)
    r["gpus_vs_smi"] = round(r["gpuloop_gpus"]["median_ms"] / r["nvidia_smi"]["median_ms"], 3)
    r["gpus_vs_smi_same_fields"] = round(
        r["gpuloop_gpus"]["median_ms"] / r["nvidia_smi_same_fields"]["median_ms"], 3)
    r["holders_minus_floor_ms"] = round(
        r["gpuloop_holders"]["median_ms"] - r["nvml_floor"]["median_ms"], 3)
    r["holders_minus_init_ms"] = round(r["gpuloop_holders"]["median_ms"] - r["nvml_init"]["median_ms"], 3)
    r["gpus_target_met"] = r["gpus_vs_smi"] <= 0.8
    r["holders_target_met"] = r["holders_minus_init_ms"] <= 10.0
    r["breakdown"] = breakdown()
    r["hyperfine"] = hyperfine([f"{BIN} gpus --json", "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader",
                                f"{BIN} holders --json", "fuser -v " + " ".join(NODES)])
    return r


def main():
    os.makedirs(OUT, exist_ok=True)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()
    procs = len([d for d in os.listdir("/proc") if d.isdigit()])
    res = dict(gpuloop=subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.strip(),
               gpus=smi, cpus=os.cpu_count(), processes=procs, runs=RUNS,
               idle=round_of("idle GPUs"))
    holder = subprocess.Popen([sys.executable, os.path.join(HERE, "mess.py"), "plain", "--gb", "2",
                               "--gpus", "0"], stdout=subprocess.PIPE, text=True, env=ENV,
                              start_new_session=True)
    try:
        line = holder.stdout.readline()
        if line.startswith("READY"):
            res["one_holder"] = round_of("one 2 GB PyTorch holder on GPU 0")
        else:
            res["one_holder"] = "the holder did not start: " + line
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    with open(os.path.join(OUT, "latency.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = [f"{res['gpuloop']}; {len(smi)} x {smi[0] if smi else '?'}; {res['cpus']} CPUs; "
          f"{procs} processes; median of {RUNS}", "",
          "| case | gpuloop gpus | nvidia-smi | ratio (target <= 0.8) | nvidia-smi, gpus' fields | ratio | gpuloop holders | fuser -v | nvmlInit_v2 | holders - init (target <= 10 ms) | NVML floor | holders - floor | gpuloop --version |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in ("idle", "one_holder"):
        r = res[key]
        if isinstance(r, str):
            continue
        md.append(f"| {key} | {r['gpuloop_gpus']['median_ms']} | {r['nvidia_smi']['median_ms']} | "
                  f"{r['gpus_vs_smi']} | {r['nvidia_smi_same_fields']['median_ms']} | "
                  f"{r['gpus_vs_smi_same_fields']} | {r['gpuloop_holders']['median_ms']} | {r['fuser_v']['median_ms']} | "
                  f"{r['nvml_init']['median_ms']} | {r['holders_minus_init_ms']} | "
                  f"{r['nvml_floor']['median_ms']} | {r['holders_minus_floor_ms']} | "
                  f"{r['gpuloop_version']['median_ms']} |")
    md.append("")
    for key in ("idle", "one_holder"):
        r = res[key]
        if isinstance(r, str):
            continue
        met = lambda ok: "met" if ok else "MISSED"
        md.append(f"- {key}: gpus / nvidia-smi = {r['gpus_vs_smi']} (target <= 0.8: "
                  f"{met(r['gpus_target_met'])}); holders - nvmlInit_v2 = "
                  f"{r['holders_minus_init_ms']} ms (target <= 10 ms: {met(r['holders_target_met'])})")
    with open(os.path.join(OUT, "latency.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    print(json.dumps(res["idle"]["breakdown"], indent=1))


if __name__ == "__main__":
    main()
