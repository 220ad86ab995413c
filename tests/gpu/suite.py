"""The real-GPU scenario suite: builds each mess with PyTorch (mess.py), asks gpuloop what it
sees, cleans up with gpuloop, and compares with the one-liner people type today. The faults
scenarios (xid31, faults, reset-dry-run) cause a real, recoverable Xid 31 (xid31.py) and read
ECC, remapped rows and reset readiness; they never reset a GPU.

    python3 tests/gpu/suite.py [--bin target/release/gpuloop] [--only NAME,...] [--out DIR]

Runs on a machine of your own with NVIDIA GPUs (it kills every process using the GPUs in the
one-liner baselines). Writes results.json and results.md to --out (default $OUT or .), prints
the table last, and exits 1 if any check failed.
"""
import json, os, select, shutil, signal, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = "target/release/gpuloop"
ONLY = None
OUT = os.environ.get("OUT", ".")
argv = sys.argv[1:]
while argv:
    a = argv.pop(0)
    if a == "--bin":
        BIN = argv.pop(0)
    elif a == "--only":
        ONLY = argv.pop(0).split(",")
    elif a == "--out":
        OUT = argv.pop(0)
BIN = os.path.abspath(BIN)
ENV = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
           NVSHMEM_DISABLE_NVLS="1", PYTHONUNBUFFERED="1")
ENV.pop("GPULOOP_SIM", None)
ONE_LINER = "fuser -k /dev/nvidia*; sleep 5; nvidia-smi --query-gpu=index,memory.used --format=csv,noheader"

results = []      # one dict per check
rows = []         # one dict per field scenario (the BENCHMARKS table)
started = []      # every pid this suite started, killed at the end


def log(*a):
    print(*a, flush=True)


def sh(cmd, timeout=120, **kw):
    t = time.monotonic()
    p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True,
                       timeout=timeout, env=kw.pop("env", ENV), **kw)
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t


def gl(*args, timeout=120):
    return sh([BIN, *args], timeout=timeout)


def gl_json(*args):
    rc, out, err, _ = gl("--json", *args)
    # diagnose exits 1 when a selected GPU is not clean; its JSON is the answer all the same.
    if rc != 0 and not (args[0] == "diagnose" and rc == 1 and out.strip()):
        raise RuntimeError(f"gpuloop {' '.join(args)} exited {rc}: {err.strip()}")
    return json.loads(out)


def smi_gpus():
    rc, out, _, _ = sh(["nvidia-smi", "--query-gpu=index,uuid,memory.used,memory.total",
                        "--format=csv,noheader,nounits"])
    rows = []
    for line in out.strip().splitlines():
        i, uuid, used, total = [x.strip() for x in line.split(",")]
        rows.append({"index": int(i), "uuid": uuid, "used": int(used), "total": int(total)})
    return rows


NGPU = len(smi_gpus())


def used_mib():
    return [g["used"] for g in smi_gpus()]


def check(name, ok, **detail):
    results.append(dict(check=name, ok=bool(ok), **detail))
    log(("PASS " if ok else "FAIL ") + name + " " + json.dumps(detail)[:600])


def mess(mode, *extra, timeout=120, in_script=False, env=None, launcher=()):
    """Starts mess.py MODE and returns (Popen, info) once it printed READY. With `in_script`,
    it runs as a background job of a non-interactive bash script (`python3 mess.py … &; wait`),
    so it shares the script's process group instead of leading its own. `launcher` runs it
    under another program (real torchrun) instead of python3."""
    argv = [*(launcher or [sys.executable]), os.path.join(HERE, "mess.py"), mode, *extra]
    if in_script:
        argv = ["bash", "-c", '"$@" & wait', "script", *argv]
    p = subprocess.Popen(argv,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or ENV,
                         start_new_session=True)
    started.append(p.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 1.0)
        if r:
            line = p.stdout.readline()
            if line.startswith("READY "):
                info = json.loads(line[6:])
                started.extend(info.get("pids", []))
                return p, info
            if line == "" and p.poll() is not None:
                break
    err = p.stderr.read() if p.poll() is not None else ""
    kill_pids([p.pid])
    raise RuntimeError(f"mess {mode} did not get ready: {err[-2000:]}")


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def ppid_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def kill_pids(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def wait_free(timeout=30):
    """Bounded wait until every GPU reads 0 MiB (between scenarios)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(u == 0 for u in used_mib()):
            return True
        time.sleep(0.05)
    return False


def reset_between():
    kill_pids(list(started))
    for pid in list(started):
        end = time.monotonic() + 10
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.01)
    started.clear()
    if not wait_free(30):
        log("WARNING: memory still used between scenarios:", used_mib())


def poller():
    """An independent 1 ms NVML poll, in its own process: prints the wall time when every GPU
    first reads (near) 0 MiB."""
    code = r'''
import pynvml, time, sys
pynvml.nvmlInit()
hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
print("up", flush=True)
end = time.time() + 120
while time.time() < end:
    # v2: "used" without the reserved memory (v1 counts ~0.5 GiB reserved as used on H200s)
    if all(pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).used < (1 << 20) * 64 for h in hs):
        print("free %.6f" % time.time(), flush=True); break
    time.sleep(0.001)
'''
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    assert p.stdout.readline().strip() == "up"
    return p


def timed_clean(extra=()):
    """gpuloop clean with the independent poller: (rc, seconds, overhead over the driver's
    release in ms, output)."""
    pl = poller()
    t0 = time.time()
    rc, out, err, dt = gl("--json", "clean", "--timeout", "60", *extra, timeout=120)
    t1 = time.time()
    try:
        line = pl.communicate(timeout=10)[0].strip()
    except subprocess.TimeoutExpired:
        pl.kill(); line = ""
    free_at = float(line.split()[1]) if line.startswith("free") else None
    overhead = (t1 - free_at) * 1000 if free_at else None
    released = (free_at - t0) if free_at else None
    return rc, t1 - t0, released, overhead, out, err


def one_liner():
    rc, out, err, dt = sh(["bash", "-c", ONE_LINER], timeout=60)
    used = used_mib()
    return dt, all(u == 0 for u in used), used


def diagnose_verdicts():
    try:
        return [d["verdict"] for d in gl_json("diagnose")]
    except Exception as e:
        return [f"error: {e}"]


def scenario(name):
    def deco(fn):
        if ONLY is None or name in ONLY:
            SCENARIOS.append((name, fn))
        return fn
    return deco


SCENARIOS = []

# ---------------------------------------------------------------- issue 2: what gpuloop sees

@scenario("inventory")
def s_inventory():
    p, info = mess("plain", "--gb", "10", "--gpus", "0")
    g = gl_json("gpus")
    s = smi_gpus()
    ok = len(g) == len(s) == NGPU
    for a, b in zip(g, s):
        ok &= a["uuid"] == b["uuid"] and a["index"] == b["index"]
        ok &= abs(a["mem_used_mib"] - b["used"]) <= max(0.01 * b["total"], 2)
    check("gpu() agrees with nvidia-smi (index, uuid, memory within 1%)", ok,
          gpuloop=[(x["index"], x["uuid"][:12], x["mem_used_mib"], x["minor"]) for x in g],
          smi=[(x["index"], x["uuid"][:12], x["used"]) for x in s])
    hs = gl_json("holders")
    me = [h for h in hs if h["pid"] == info["pids"][0]]
    ok = len(me) == 1 and {"driver", "fd", "map"} <= set(me[0]["evidence"]) and me[0]["mem"] >= 10e9 * 0.99
    check("a 10 GB PyTorch holder is found with evidence driver+fd+map and its mem", ok,
          holder={k: me[0][k] for k in ("pid", "gpus", "mem", "evidence", "role", "state")} if me else None)
    if NGPU > 1:
        d1 = gl_json("diagnose", "--gpu", "1")[0]
        check("a few MiB on GPU 1 from the GPU-0 holder's context are named, not blamed on the driver",
              d1["mem_used_mib"] == 0 or (d1["verdict"] == "footprint" and any(f["pid"] == info["pids"][0] for f in d1.get("footprint", []))),
              diagnosis={k: d1.get(k) for k in ("mem_used_mib", "verdict", "advice", "footprint")})
    # latency: gpu() and holders() in-process, against spawning nvidia-smi / fuser
    rc, out, err, _ = gl("eval", "let t = now(); for i in 0..200 { gpu(); } let a = (now() - t) / 200.0; "
                         "let t = now(); for i in 0..50 { holders(); } let b = (now() - t) / 50.0; [a * 1000.0, b * 1000.0]")
    lat = json.loads(out.strip().replace("[", "[").replace("]", "]")) if rc == 0 else None
    smi_t = []
    for _ in range(20):
        t = time.monotonic(); sh(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader"]); smi_t.append(time.monotonic() - t)
    gl_t = []
    for _ in range(20):
        t = time.monotonic(); gl("--json", "gpus"); gl_t.append(time.monotonic() - t)
    fu_t = []
    for _ in range(20):
        t = time.monotonic(); sh("fuser -v /dev/nvidia* >/dev/null 2>&1"); fu_t.append(time.monotonic() - t)
    hl_t = []
    for _ in range(20):
        t = time.monotonic(); gl("--json", "holders"); hl_t.append(time.monotonic() - t)
    med = lambda v: sorted(v)[len(v) // 2] * 1000
    check("latency measured", lat is not None, gpu_in_process_ms=lat and round(lat[0], 3),
          holders_in_process_ms=lat and round(lat[1], 3), gpuloop_gpus_cmd_ms=round(med(gl_t), 2),
          nvidia_smi_cmd_ms=round(med(smi_t), 2), gpuloop_holders_cmd_ms=round(med(hl_t), 2),
          fuser_v_cmd_ms=round(med(fu_t), 2), ngpu=NGPU)


@scenario("inherited")
def s_inherited():
    p, info = mess("fork", "--gb", "10", "--gpus", "0")
    end = time.monotonic() + 10
    while alive(info["creator"]) and time.monotonic() < end:
        time.sleep(0.01)
    hs = gl_json("holders")
    found = [h for h in hs if h["pid"] == info["child"]]
    d = gl_json("diagnose", "--gpu", "0")[0]
    check("a forked child holding inherited handles is found after its creator exited",
          len(found) == 1 and "map" in found[0]["evidence"],
          holder=found[0] if found else hs, creator=info["creator"])
    check("diagnose says inherited, with the dead creator in ghost_pids",
          d["verdict"] == "inherited" and info["creator"] in d["ghost_pids"],
          verdict=d["verdict"], ghost_pids=d["ghost_pids"], advice=d["advice"])


@scenario("defunct-leader")
def s_defunct_leader():
    """The main thread exits (SYS_exit) while another thread keeps the CUDA context: a live
    holder found through its threads, killed by pid, memory verified."""
    p, info = mess("defunct-leader", "--gb", "4", "--gpus", "0")
    pid = info["pids"][0]

    def state():
        try:
            with open(f"/proc/{pid}/status") as f:
                st = dict(l.split(":\t", 1) for l in f.read().splitlines() if ":\t" in l)
            return st.get("State", "")[:1], int(st.get("Threads", "0"))
        except OSError:
            return None, 0
    until(lambda: state()[0] == "Z", 20)
    st, threads = state()
    hs = [h for h in gl_json("holders", "--gpu", "0") if h["pid"] == pid]
    d = gl_json("diagnose", "--gpu", "0")[0]
    check("defunct-leader: the zombie leader with live threads is a holder of GPU 0 with its memory",
          st == "Z" and threads > 1 and len(hs) == 1 and hs[0]["mem_mib"] > 3000
          and "main thread exited" in hs[0]["state"],
          state=st, threads=threads, holder=hs, used=used_mib())
    check("defunct-leader: diagnose names it, never other-namespace",
          d["verdict"] in ("held", "orphaned") and pid not in d["ghost_pids"],
          verdict=d["verdict"], advice=d["advice"], ghosts=d["ghost_pids"])
    rc, total, released, overhead, out, err = timed_clean()
    check("defunct-leader: gpuloop clean frees it (exit 0, 0 MiB, the process gone)",
          rc == 0 and all(u == 0 for u in used_mib()) and not alive(pid),
          rc=rc, seconds=round(total, 3), used=used_mib(), err=err.strip()[-300:])


@scenario("observer")
def s_observer():
    p, info = mess("observer")
    pid = info["pids"][0]
    default = [h["pid"] for h in gl_json("holders")]
    allh = [h for h in gl_json("holders", "--all") if h["pid"] == pid]
    check("an NVML-only observer is role observer and not returned by default",
          pid not in default and len(allh) == 1 and allh[0]["role"] == "observer",
          all=allh, default=default)


@scenario("namespace")
def s_namespace():
    p, info = mess("plain", "--gb", "10", "--gpus", "0")
    rc, out, err, _ = sh(["unshare", "--pid", "--fork", "--mount-proc", BIN, "--json", "diagnose", "--gpu", "0"])
    d = json.loads(out)[0] if rc in (0, 1) and out.strip() else {}
    check("inside unshare --pid --fork --mount-proc, memory held outside is other-namespace",
          d.get("verdict") == "other-namespace", verdict=d.get("verdict"), advice=d.get("advice"), rc=rc, err=err[-300:])


@scenario("nodriver")
def s_nodriver():
    rc, out, _, _ = sh("ldconfig -p | awk '/libnvidia-ml.so.1 /{print $NF; exit}'")
    lib = os.path.realpath(out.strip())
    for args in (["gpus"], ["diagnose"], ["clean", "--timeout", "5"]):
        rc, out, err, _ = sh(["unshare", "--mount", "sh", "-c",
                              f"mount --bind /dev/null {lib} && exec {BIN} {' '.join(args)}"])
        check(f"no driver library: {args[0]} exits 1 saying what failed to load, never clean",
              rc == 1 and "no NVIDIA driver:" in err and "clean" not in out and "panicked" not in err,
              rc=rc, stdout=out.strip(), stderr=err.strip()[:300], lib=lib)

# ------------------------------------------------------------ issue 3: cleanup, time to clean

def clean_row(name, build, verdict_check=None, extra_clean=()):
    """Builds the mess, diagnoses, cleans with gpuloop (timed), rebuilds it, runs the one-liner."""
    p, info = build()
    before = diagnose_verdicts()
    rc, total, released, overhead, out, err = timed_clean(extra_clean)
    after = used_mib()
    clean = rc == 0 and all(u == 0 for u in after)
    left = [pid for pid in info.get("pids", []) if alive(pid)]
    check(f"{name}: gpuloop clean frees every GPU (exit 0, 0 MiB)", clean,
          rc=rc, seconds=round(total, 3), after=after, verdicts=before, left=left, err=err.strip()[-300:])
    if verdict_check:
        check(f"{name}: diagnose before cleanup", verdict_check(before), verdicts=before)
    reset_between()
    p, info = build()
    ol_t, ol_clean, ol_used = one_liner()
    reset_between()
    rows.append(dict(scenario=name, verdict=",".join(sorted(set(v for v in before if v != "clean"))) or "clean",
                     gpuloop_clean=clean, gpuloop_s=round(total, 3),
                     driver_release_s=round(released, 3) if released else None,
                     overhead_ms=round(overhead, 1) if overhead is not None else None,
                     one_liner_clean=ol_clean, one_liner_s=round(ol_t, 3)))


@scenario("clean-plain")
def s_clean_plain():
    clean_row("10 GB PyTorch holder", lambda: mess("plain", "--gb", "10", "--gpus", "0"),
              lambda v: v[0] == "held")


@scenario("clean-mp")
def s_clean_mp():
    def build():
        p, info = mess("mp", "--gb", "10")
        kill_pids([info["launcher"]])
        return p, info
    clean_row("torch.multiprocessing workers, launcher SIGKILLed", build,
              lambda v: all(x == "orphaned" for x in v))


@scenario("lineage-rows")
def s_lineage_rows():
    """Issue 15: the launcher in its own process group (setsid) and as a background job of a
    script; both read `held` while it lives and `orphaned` once it is SIGKILLed."""
    for row, in_script in (("own group", False), ("script's group", True)):
        p, info = mess("mp", "--gb", "4", in_script=in_script)
        launcher, workers = info["launcher"], info["pids"][1:]
        hs = [h for h in gl_json("holders") if h["pid"] in workers]
        check(f"lineage {row}: workers name their launcher",
              len(hs) == len(workers) and all((h.get("launcher") or {}).get("pid") == launcher
                                              and not h["reparented"] for h in hs),
              holders=[(h["pid"], h["ppid"], h["pgid"], h.get("launcher"), h["reparented"]) for h in hs])
        before = [v for v in diagnose_verdicts() if v != "clean"]
        check(f"lineage {row}: held while the launcher lives",
              before and all(v == "held" for v in before), verdicts=before)
        kill_pids([launcher])
        # Not alive(launcher): a multi-threaded launcher's leader reads Z while its other
        # threads still exit (freeing CUDA memory), and its children are reparented only when
        # the last one has; wait for that.
        end = time.monotonic() + 10
        while any(ppid_of(w) == launcher for w in workers) and time.monotonic() < end:
            time.sleep(0.01)
        hs = [h for h in gl_json("holders") if h["pid"] in workers]
        after = [v for v in diagnose_verdicts() if v != "clean"]
        check(f"lineage {row}: orphaned once the launcher is SIGKILLed",
              after and all(v == "orphaned" for v in after)
              and all(h["reparented"] and h.get("launcher") is None for h in hs),
              verdicts=after, holders=[(h["pid"], h["ppid"], h["ppid_comm"], h["pgid"]) for h in hs])
        rc, out, err, t = gl("clean", "--timeout", "30")
        check(f"lineage {row}: clean frees it", rc == 0 and all(u == 0 for u in used_mib()),
              rc=rc, seconds=round(t, 3), err=err.strip()[-300:])
        reset_between()


@scenario("clean-fork")
def s_clean_fork():
    clean_row("forked child with inherited handles", lambda: mess("fork", "--gb", "10", "--gpus", "0"),
              lambda v: v[0] == "inherited")

# ----------------------------------------------------------- issue 5: field patterns

@scenario("ddp")
def s_ddp():
    def build():
        p, info = mess("ddp", "--gb", "10")
        kill_pids([info["launcher"]])
        return p, info
    clean_row("torch.distributed NCCL ranks, launcher SIGKILLed", build,
              lambda v: all(x == "orphaned" for x in v))


@scenario("vllm")
def s_vllm():
    def build():
        p, info = mess("vllm", "--gb", "10")
        kill_pids([info["api"]])
        return p, info
    clean_row("vLLM-shaped: API killed, engine core + setsid workers", build,
              lambda v: all(x in ("orphaned", "held") for x in v))


@scenario("ipc")
def s_ipc():
    def build():
        p, info = mess("ipc", "--gb", "10", "--gpus", "0")
        kill_pids([info["exporter"]])
        return p, info
    clean_row("CUDA IPC: exporter killed, importer holds", build)


@scenario("ignore-term")
def s_ignore_term():
    clean_row("holder ignoring SIGTERM", lambda: mess("ignore-term", "--gb", "10", "--gpus", "0"),
              extra_clean=("--grace", "2"))


@scenario("slow-term")
def s_slow_term():
    clean_row("SIGTERM handler taking 3 s", lambda: mess("slow-term", "--gb", "10", "--gpus", "0"))


@scenario("stopped")
def s_stopped():
    clean_row("holder stopped with SIGSTOP", lambda: mess("stopped", "--gb", "10", "--gpus", "0"))


@scenario("run-timeout")
def s_run_timeout():
    script = os.path.join(tempfile.mkdtemp(), "job.rhai")
    with open(script, "w") as f:
        f.write(f'''let t = now();
let r = run(["{sys.executable}", "{os.path.join(HERE, "mess.py")}", "mp", "--gb", "10"], #{{timeout: 25, echo: false, grace: 2}});
let ok = wait_clean((), #{{timeout: 20}});
print(to_json(#{{timed_out: r.timed_out, clean: ok, seconds: now() - t}}));
''')
    # The job holds memory until the timeout; a shorter timeout once it holds would race the
    # workers' start, so the script's timeout is long and the check is on what is left.
    rc, out, err, dt = sh([BIN, "run", script], timeout=200)
    res = json.loads(out.strip().splitlines()[-1]) if rc == 0 and out.strip() else {}
    check("run() with a timeout on a multi-GPU job: nothing left after it returns",
          res.get("timed_out") is True and res.get("clean") is True and all(u == 0 for u in used_mib()),
          result=res, rc=rc, err=err[-300:])

# ------------------------------------------------- issue 11: truth at the edges (real driver)

def until(fn, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.1)
    return fn()


def holder_pids(gpu):
    try:
        return [h["pid"] for h in gl_json("holders", "--gpu", str(gpu))]
    except Exception:
        return []


@scenario("footprint")
def s_footprint():
    """A GPU-0 job's CUDA context keeps 3-4 MiB on GPU 1: a clean of GPU 1 passes beside it."""
    if NGPU < 2:
        check("footprint: needs 2 GPUs", True, skipped=f"{NGPU} GPU(s)")
        log("SKIP footprint: needs 2 GPUs")
        return
    p0, i0 = mess("plain", "--gb", "4", "--gpus", "0")
    p1, i1 = mess("plain", "--gb", "4", "--gpus", "1")
    job, other = i0["pids"][0], i1["pids"][0]
    rc, out, err, dt = gl("--json", "clean", "--gpu", "1", "--timeout", "60")
    rep = json.loads(out) if out.strip() else {}
    d1 = (rep.get("gpus") or [{}])[0]
    used1 = used_mib()[1]
    check("footprint: clean --gpu 1 beside a GPU-0 job exits 0, spares the job, stops the GPU-1 holder",
          rc == 0 and alive(job) and not alive(other) and dt < 15,
          rc=rc, seconds=round(dt, 3), used_gpu1_mib=used1, verdict=d1.get("verdict"),
          advice=d1.get("advice"), err=err.strip()[-300:])
    check("footprint: the report names what is left on GPU 1 (the GPU-0 job's CUDA footprint)",
          used1 == 0 or (d1.get("verdict") == "footprint" and f"CUDA footprint of pid {job}" in d1.get("advice", "")),
          used_gpu1_mib=used1, verdict=d1.get("verdict"), advice=d1.get("advice"))
    hs = gl_json("holders", "--gpu", "1")
    d = gl_json("diagnose", "--gpu", "1")[0]
    check("footprint: holders --gpu 1 and diagnose --gpu 1 agree (nobody holds GPU 1)",
          hs == [] and d["holders"] == [] and (used1 == 0 or any(f["pid"] == job for f in d["footprint"])),
          holders=hs, diagnose={k: d[k] for k in ("verdict", "holders", "footprint", "mem_used_mib")})
    rc, out, err, dt = gl("clean", "--gpu", "1", "--strict", "--timeout", "3")
    check("footprint: --strict demands 0 MiB (exit 1 while the footprint is there)",
          rc == (1 if used_mib()[1] > 0 else 0), rc=rc, used_gpu1_mib=used_mib()[1], seconds=round(dt, 3))


@scenario("restarter")
def s_restarter():
    """`bash -c 'while true; do python3 holder.py; done'`: clean names the loop, --settle sees
    the holder come back (respawning), --parents stops the loop."""
    loop = f"while true; do {sys.executable} {os.path.join(HERE, 'mess.py')} plain --gb 4 --gpus 0 >/dev/null; done"
    sh_loop = subprocess.Popen(["bash", "-c", loop], env=ENV, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started.append(sh_loop.pid)
    bash = sh_loop.pid
    try:
        ok = until(lambda: holder_pids(0), 120)
        rc, out, err, dt = gl("--json", "clean", "--gpu", "0", "--timeout", "60")
        rep = json.loads(out) if out.strip() else {}
        rs = rep.get("kill", {}).get("restarters", [])
        check("restarter: clean names the bash loop that started the holder",
              ok and any(r["pid"] == bash for r in rs), restarters=rs, rc=rc, seconds=round(dt, 3))
        ok = until(lambda: holder_pids(0), 120)
        rc, out, err, dt = gl("--json", "clean", "--gpu", "0", "--timeout", "60", "--settle", "20")
        rep = json.loads(out) if out.strip() else {}
        d0 = (rep.get("gpus") or [{}])[0]
        check("restarter: clean --settle 20 sees the holder come back: exit 1, respawning naming bash",
              ok and rc == 1 and d0.get("verdict") == "respawning" and str(bash) in d0.get("advice", ""),
              rc=rc, seconds=round(dt, 3), verdict=d0.get("verdict"), advice=d0.get("advice"))
        until(lambda: holder_pids(0), 120)
        rc, out, err, dt = gl("clean", "--gpu", "0", "--timeout", "60", "--parents", "--settle", "10")
        check("restarter: clean --parents stops the loop too, and GPU 0 stays clean",
              rc == 0 and until(lambda: not alive(bash), 10) and used_mib()[0] == 0,
              rc=rc, seconds=round(dt, 3), bash_alive=alive(bash), used=used_mib(), out=out[-400:])
    finally:
        try:
            os.killpg(bash, signal.SIGKILL)
        except OSError:
            pass


@scenario("workers")
def s_workers():
    """stdlib workers on a vLLM-shaped job (API, engine core, one setsid worker per GPU) beside a
    plain holder: jobs() puts each worker under the engine core (one job per session, as the
    workers setsid), never with the plain holder; stop(…, parents: true) takes the workers and
    names the engine core (their parent, which has not shown that it restarts them: --parents
    stops only a parent that has) and leaves it and the other job running."""
    p, info = mess("vllm", "--gb", "4")
    other, oinfo = mess("plain", "--gb", "2", "--gpus", "0")
    api, pids = info["api"], info["pids"]
    engine = [q for q in pids if q != api and ppid_of(q) == api]
    workers = [q for q in pids if q not in (api, *engine)]
    jobs = gl_json("eval", 'import "workers" as w; w::jobs().map(|j| #{pids: j.pids, '
                   'launcher: if j.launcher == () { 0 } else { j.launcher.pid }, gpus: j.gpus, '
                   'mem_mib: j.mem_mib, kind: j.kind})')
    mine = [j for j in jobs if set(j["pids"]) & set(workers)]
    check("workers: jobs() puts the vLLM-shaped job's workers under its engine core, apart from the plain holder",
          engine and mine and all(j["launcher"] == engine[0] for j in mine)
          and sorted(q for j in mine for q in j["pids"]) == sorted(workers)
          and not any(oinfo["pids"][0] in j["pids"] for j in mine),
          jobs=jobs, engine=engine, workers=workers)
    t = time.monotonic()
    rc, out, err, _ = gl("--json", "eval",
                         'import "workers" as w; let js = w::jobs().filter(|j| j.launcher != () && j.launcher.pid == %d); '
                         'let rs = js.map(|j| w::stop(j, #{grace: 5, parents: true})); '
                         '#{jobs: js.len(), clean: rs.all(|r| r.clean == true), signalled: rs.map(|r| r.kill.signalled)}'
                         % (engine[0] if engine else -1))
    dt = time.monotonic() - t
    r = json.loads(out) if out.strip() else {}
    check("workers: stop() frees the job's GPUs, names the engine core it leaves running, and leaves the other job",
          rc == 0 and r.get("clean") is True and all(not alive(q) for q in workers)
          and all(alive(q) for q in engine) and alive(oinfo["pids"][0])
          and all(f"pid {q} " in err and "may restart it" in err for q in engine),
          rc=rc, seconds=round(dt, 3), result=r, other_alive=alive(oinfo["pids"][0]), err=err[-400:])


@scenario("daemon")
def s_daemon():
    """MPS: clean stops the client, leaves the control daemon and the server, and exits 0: the
    memory the server keeps is not dirt (reported as "N MiB: MPS server pid P", advice `echo
    quit | nvidia-cuda-mps-control`, never systemctl or a reset); --strict counts it."""
    ctl = shutil.which("nvidia-cuda-mps-control")
    if not ctl:
        check("daemon: needs nvidia-cuda-mps-control", True, skipped="MPS not installed")
        log("SKIP daemon: nvidia-cuda-mps-control not installed")
        return
    tmp = tempfile.mkdtemp()
    env = dict(ENV, CUDA_MPS_PIPE_DIRECTORY=os.path.join(tmp, "pipe"),
               CUDA_MPS_LOG_DIRECTORY=os.path.join(tmp, "log"), CUDA_VISIBLE_DEVICES="0")
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"]), os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    subprocess.run([ctl, "-d"], env=env, check=True)
    try:
        p, info = mess("plain", "--gb", "2", "--gpus", "0", env=env)
        client = info["pids"][0]
        rc, out, err, dt = gl("clean", "--gpu", "0", "--timeout", "30")
        d = gl_json("diagnose", "--gpu", "0")[0]
        mps = [h for h in gl_json("holders", "--all") if h["name"].startswith("nvidia-cuda-mps")]
        server = [h["pid"] for h in mps if h["ppid"] in [m["pid"] for m in mps]]
        check("daemon: clean stops the MPS client, leaves both MPS processes, and exits 0",
              rc == 0 and not alive(client) and len(mps) == 2 and all(alive(h["pid"]) for h in mps),
              rc=rc, seconds=round(dt, 3), out=out[-600:], err=err[-300:], mps=[(h["pid"], h["ppid"], h["mem_mib"]) for h in mps])
        check("daemon: the report names what the MPS server keeps and MPS's own way to stop",
              bool(server) and f"MiB: MPS server pid {server[0]}" in out
              and "echo quit | nvidia-cuda-mps-control" in out and "systemctl" not in d["advice"]
              and "reset" not in d["advice"],
              out=out[-600:], verdict=d["verdict"], advice=d["advice"], mem=d["mem_used_mib"])
        rc_d, _, _, _ = gl("diagnose", "--gpu", "0")
        rc_w, _, _, _ = gl("wait", "--gpu", "0", "--timeout", "0")
        rc_s, _, _, _ = gl("wait", "--gpu", "0", "--timeout", "0", "--strict")
        check("daemon: diagnose and wait read clean (exit 0); --strict counts the server's memory (exit 1)",
              rc_d == 0 and rc_w == 0 and (rc_s == 1 or d["mem_used_mib"] == 0),
              diagnose=rc_d, wait=rc_w, strict=rc_s, mem=d["mem_used_mib"])
    finally:
        subprocess.run([ctl], input="quit\n", text=True, env=env)
        until(lambda: not [h for h in gl_json("holders", "--all") if "mps" in h["name"]], 20)



# ----------------------------------------------------- issue 36: the GPUs' faults, resets
# Read-only against the lent GPU: never `gpuloop reset` without --dry-run here, never
# `clean-node --allow-reset`, never nvidia-smi -r.

def smi_bus_ids():
    """index -> PCI bus id as nvidia-smi writes it ("00000000:00:06.0")."""
    rc, out, _, _ = sh(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"])
    return {int(i): b.strip() for i, b in (l.split(",") for l in out.strip().splitlines())}


def dmesg_xids():
    """The Xid lines of the kernel log, as dmesg prints them (root)."""
    rc, out, err, _ = sh(["dmesg"])
    return [l for l in out.splitlines() if "NVRM: Xid (" in l], rc, err.strip()


def same_bus(nvml, kernel):
    """NVML's 00000000:00:06.0 and the kernel's PCI:0000:00:06: the same device."""
    k = kernel.replace("PCI:", "").split(":")
    n = nvml.split(":")
    return int(k[0], 16) == int(n[0], 16) and int(k[1], 16) == int(n[1], 16) and \
        int(k[2].split(".")[0], 16) == int(n[2].split(".")[0], 16)


@scenario("xid31")
def s_xid31():
    """A real, recoverable Xid 31 (tests/gpu/xid31.py: a Triton kernel stores far past its
    buffer; only its own context dies): gpus --json and diagnose report it on the GPU whose
    bus id the kernel names, with the pid and name the driver gives; xids(t) gives it to a
    script; gpuloop's events of that bus agree with dmesg's."""
    t = float(gl("eval", "now()")[1].strip())
    before, _, _ = dmesg_xids()
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "xid31.py")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(ENV, CUDA_VISIBLE_DEVICES="0"))
    started.append(p.pid)
    try:
        out, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_pids([p.pid]); out, err = p.communicate()
    check("xid31: the faulting kernel fails its own context (exit 3)", p.returncode == 3,
          rc=p.returncode, out=out.strip()[-300:], err=err.strip()[-300:])
    until(lambda: any(f"): 31, pid={p.pid}," in l for l in dmesg_xids()[0]), 15)
    after, drc, derr = dmesg_xids()
    new = [l for l in after if l not in before]
    bus = smi_bus_ids()
    g = gl_json("gpus")
    mine = [x for x in g[0]["faults"]["xid"] if x["code"] == 31 and x["pid"] == p.pid]
    check("xid31: gpus --json has the Xid 31 on GPU 0, with the driver's pid and name, matched by bus id",
          len(mine) == 1 and mine[0]["name"] and same_bus(bus[0], mine[0]["bus_id"])
          and mine[0]["action"] == "restart-app" and "page fault" in (mine[0]["meaning"] or "")
          and all(not any(x["pid"] == p.pid for x in gg["faults"]["xid"]) for gg in g[1:]),
          event=mine, bus=bus, dmesg_new=new[-3:], log_error=g[0]["faults"]["log_error"])
    d = gl_json("diagnose", "--gpu", "0")[0]
    check("xid31: diagnose carries it, and the GPU reads clean after (an application's own fault)",
          d["verdict"] == "clean" and any(x["code"] == 31 and x["pid"] == p.pid for x in d["faults"]["xid"]),
          verdict=d["verdict"], advice=d["advice"])
    rc, out, err, _ = gl("--json", "eval", f"xids({t})")
    got = json.loads(out) if rc == 0 else []
    check("xid31: xids(t) gives the run's Xid to a script, with its GPU",
          any(x["code"] == 31 and x["pid"] == p.pid and x["gpu"] == 0 for x in got),
          rc=rc, got=got[-3:], err=err.strip()[-300:])
    # Every Xid dmesg has for GPU 0's bus is one gpuloop has (up to its 32 latest).
    ours = [x for x in g[0]["faults"]["xid"] if x["kind"] == "xid"]
    kernel = [l for l in after if same_bus(bus[0], l.split("Xid (")[1].split(")")[0])]
    check("xid31: gpuloop's Xid events of GPU 0 agree with dmesg's",
          drc == 0 and len(ours) == min(len(kernel), 32)
          and [x["code"] for x in ours] == [int(l.split("): ")[1].split(",")[0]) for l in kernel][-32:],
          gpuloop=[(x["code"], x["pid"]) for x in ours][-5:], dmesg=kernel[-5:], dmesg_rc=drc, dmesg_err=derr[-200:])
    rc, out, err, _ = gl("run", "preflight", "--gpu", "0", "--xid-window", "600")
    check("xid31: preflight fails on the recent Xid 31 with one line saying what it means",
          rc == 1 and "had Xid 31" in err and len(err.strip().splitlines()) == 1,
          rc=rc, out=out.strip(), err=err.strip())


def smi_faults():
    """Per GPU, from nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT: the volatile ECC counts
    (every memory location summed, as NVML's total), the remapped rows, and whether retired
    pages are reported at all."""
    rc, out, _, _ = sh(["nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER,PAGE_RETIREMENT"])
    gpus, cur, section = [], None, None
    for line in out.splitlines():
        if line.startswith("GPU 0000") or line.startswith("GPU 0"):
            cur = dict(corrected=0, uncorrected=0, rows={}, retired="?")
            gpus.append(cur)
            continue
        if cur is None:
            continue
        s = line.strip()
        key, _, val = s.partition(":")
        key, val = key.strip(), val.strip()
        if key in ("Volatile", "Aggregate", "Remapped Rows", "Retired Pages", "Pending Page Blacklist"):
            section = key
            if key == "Retired Pages" and val:
                cur["retired"] = val
            continue
        if not val:
            continue
        if section == "Volatile" and val.isdigit():
            if "Uncorrectable" in key:
                cur["uncorrected"] += int(val)
            elif "Correctable" in key:
                cur["corrected"] += int(val)
        elif section == "Remapped Rows":
            cur["rows"][key] = val
        elif section == "Retired Pages":
            cur["retired"] = val if cur["retired"] == "?" else cur["retired"]
    return gpus, out


@scenario("faults")
def s_faults():
    """gpu().faults agrees with nvidia-smi -q -d ECC,ROW_REMAPPER: the volatile ECC counts, the
    remapped rows (correctable, uncorrectable, pending, failure), retired pages N/A on a GPU
    that remaps rows; the recovery action reads (0, none, on a healthy H200); the kernel log
    is read (no log_error as root)."""
    smi, text = smi_faults()
    g = gl_json("gpus")
    for i, (a, b) in enumerate(zip(g, smi)):
        f = a["faults"]
        rows = b["rows"]
        yes = lambda k: rows.get(k, "").lower().startswith("yes")
        num = lambda k: int(rows[k]) if rows.get(k, "").isdigit() else None
        rr = f["remapped_rows"] or {}
        check(f"faults: GPU {i} ECC and remapped rows agree with nvidia-smi -q -d ECC,ROW_REMAPPER",
              f["ecc"] is not None and f["ecc"]["corrected"] == b["corrected"] and f["ecc"]["uncorrected"] == b["uncorrected"]
              and rr.get("correctable") == num("Correctable Error") and rr.get("uncorrectable") == num("Uncorrectable Error")
              and rr.get("pending") == yes("Pending") and rr.get("failure") == yes("Remapping Failure Occurred"),
              gpuloop=f, smi=b)
        check(f"faults: GPU {i} retired pages are N/A (it remaps rows), the recovery action is read",
              f["retired_pages"] is None and f["recovery_action"] in ("none", "gpu-reset", "node-reboot", "drain-p2p", "drain-and-reset", "recover-imex-domain", None),
              retired=f["retired_pages"], smi_retired=b["retired"], recovery=f["recovery_action"])
        check(f"faults: GPU {i}'s kernel log is read (root reads /dev/kmsg)", f["log_error"] is None,
              log_error=f["log_error"])
    rc, out, _, _ = sh("nvidia-smi -q | grep -i -A1 'recovery action'")
    log("nvidia-smi's recovery action:", out.strip() or "(not shown by this nvidia-smi)")
    # What it costs: gpus with the faults read, against nvidia-smi's own query of them.
    gl_t, smi_t = [], []
    for _ in range(10):
        t0 = time.monotonic(); gl("--json", "gpus"); gl_t.append(time.monotonic() - t0)
        t0 = time.monotonic(); sh(["nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER"]); smi_t.append(time.monotonic() - t0)
    med = lambda v: sorted(v)[len(v) // 2] * 1000
    rc, out, err, _ = gl("eval", "let t = now(); for i in 0..50 { gpu(); } (now() - t) / 50.0 * 1000.0")
    check("faults: latency measured", True, gpuloop_gpus_cmd_ms=round(med(gl_t), 2),
          nvidia_smi_q_ecc_ms=round(med(smi_t), 2), gpu_in_process_ms=out.strip())


@scenario("reset-dry-run")
def s_reset_dry_run():
    """gpuloop reset --gpu 0 --dry-run names every client that would block a reset: a PyTorch
    holder (compute), an `nvidia-smi -lms 200` loop (observer) and nvidia-persistenced where it
    runs, each with its pid and start time; nothing is stopped or reset. Never without
    --dry-run on the lent GPU."""
    p, info = mess("plain", "--gb", "2", "--gpus", "0")
    holder = info["pids"][0]
    loop = subprocess.Popen(["nvidia-smi", "-lms", "200"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=ENV, start_new_session=True)
    started.append(loop.pid)
    until(lambda: any(h["pid"] == loop.pid for h in gl_json("holders", "--all")), 20)
    rc, out, err, dt = gl("--json", "reset", "--gpu", "0", "--dry-run")
    r = json.loads(out)[0] if out.strip() else {}
    bs = {b["pid"]: b for b in r.get("blockers", []) if b["pid"]}
    def start(pid):
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])

    def comm(pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                return f.read().strip()
        except OSError:
            return ""
    persistenced = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                    if comm(pid).startswith("nvidia-persiste")]
    ok = rc == 1 and bs.get(holder, {}).get("kind") == "compute" and bs.get(loop.pid, {}).get("kind") == "observer"
    ok &= all(bs.get(pid, {}).get("start") == start(pid) for pid in (holder, loop.pid))
    ok &= all(bs.get(pid, {}).get("kind") == "persistenced" and bs[pid]["protected"] for pid in persistenced)
    check("reset-dry-run: the readiness list names the PyTorch holder, the nvidia-smi loop and nvidia-persistenced, each with its identity",
          ok, rc=rc, seconds=round(dt, 3), blockers=[(b["kind"], b["pid"], b["name"], b["how"]) for b in r.get("blockers", [])],
          persistenced=persistenced, err=err.strip()[-300:])
    check("reset-dry-run: nothing was stopped, nothing reset",
          alive(holder) and alive(loop.pid) and r.get("steps") == [] and not r.get("reset"),
          steps=r.get("steps"), used=used_mib())
    rc, out, err, _ = gl("reset", "--gpu", "0", "--dry-run")
    log(out)
    d = gl_json("diagnose", "--gpu", "0")[0]
    check("reset-dry-run: diagnose still calls the GPU held by its holder",
          d["verdict"] == "held" and any(h["pid"] == holder for h in d["holders"]),
          verdict=d["verdict"], advice=d["advice"])


@scenario("mig-mode")
def s_mig_mode():
    """The MIG mode gpuloop reads (current and pending) agrees with `nvidia-smi -q` on every
    GPU, and a GPU with MIG disabled lists no MIG device; MIG selectors are refused there with
    the list of devices (none). Read only: the lent GPU's MIG mode is never changed."""
    rc, out, err, _ = sh(["nvidia-smi", "-q"])
    smi = []
    cur = pend = None
    in_mig = False
    for line in out.splitlines():
        t = line.strip()
        if t.startswith("GPU ") and t.count(":") >= 2 and not t.startswith("GPU UUID"):
            if cur is not None or pend is not None:
                smi.append((cur, pend))
            cur = pend = None
            in_mig = False
        elif t == "MIG Mode":
            in_mig = True
        elif in_mig and t.startswith("Current"):
            cur = t.split(":", 1)[1].strip().lower()
        elif in_mig and t.startswith("Pending"):
            pend = t.split(":", 1)[1].strip().lower()
            in_mig = False
    smi.append((cur, pend))
    g = gl_json("gpus")
    ours = [((x.get("mig") or {}).get("current"), (x.get("mig") or {}).get("pending")) for x in g]
    # nvidia-smi says "N/A" where a GPU has no MIG: gpuloop's mig is () there.
    want = [(None, None) if c in (None, "n/a") else (c, p) for c, p in smi]
    check("mig-mode: gpuloop's MIG mode (current, pending) agrees with nvidia-smi -q on every GPU",
          rc == 0 and ours == want, gpuloop=ours, nvidia_smi=smi)
    off = [x for x in g if (x.get("mig") or {}).get("current") != "enabled"]
    check("mig-mode: a GPU with MIG disabled lists no MIG device, and nothing it holds names one",
          all(not (x.get("mig") or {}).get("instances") for x in off)
          and all(not h.get("mig") for h in gl_json("holders", "--all")),
          gpus=[(x["index"], x.get("mig")) for x in g])
    if off:
        i = str(off[0]["index"])
        rc, out, err, _ = gl("holders", "--gpu", f"{i}:0:0")
        check("mig-mode: a MIG selector on a GPU with MIG disabled is a usage error that says so",
              rc == 2 and "not in MIG mode" in err, rc=rc, err=err.strip()[-300:])
        rc, out, err, _ = gl("reset", "--dry-run", "--gpu", "MIG-0")
        check("mig-mode: an unknown MIG device is a usage error listing the devices there are (none)",
              rc == 2 and "no MIG device here" in err, rc=rc, err=err.strip()[-300:])


# ------------------------------------------------------ issue 10 item 1, issue 11 items 6-7

def ns_holder(gb="4"):
    """A PyTorch holder that is pid 1 of its own PID namespace (a container's main process,
    with no SIGTERM handler). Returns (Popen, its pid here) once it holds."""
    p = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                          sys.executable, os.path.join(HERE, "mess.py"), "plain", "--gb", gb, "--gpus", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                         start_new_session=True)
    started.append(p.pid)
    end = time.monotonic() + 120
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 1.0)
        if r and p.stdout.readline().startswith("READY "):
            break
    for h in gl_json("holders", "--gpu", "0"):
        if "mess.py" in h["cmdline"]:
            started.append(h["pid"])
            return p, h["pid"]
    raise RuntimeError("the namespace-init holder is not listed")


@scenario("ns-init-kill")
def s_ns_init_kill():
    p, pid = ns_holder()
    t = time.monotonic()
    rc, out, err, _ = gl("--json", "clean", "--gpu", "0", "--grace", "10", timeout=120)
    dt = time.monotonic() - t
    r = json.loads(out) if out.strip() else {}
    at_once = [k for k in r.get("kill", {}).get("killed_at_once", []) if k["pid"] == pid]
    check("a PyTorch holder that is a PID-namespace init gets KILL at once, not the 10 s grace",
          rc == 0 and r.get("clean") is True and at_once and dt < 5,
          seconds=round(dt, 2), killed_at_once=at_once, rc=rc, err=err[-300:])


@scenario("recycled-pid")
def s_recycled_pid():
    # All inside one fresh PID namespace (so ns_last_pid can force the reuse): a PyTorch
    # holder is listed, SIGKILLed, its pid given to a `sleep`, then the stale holder map is
    # passed to kill(). The sleep must live, and the signal log stay empty. 20 rounds.
    work = tempfile.mkdtemp()
    script = os.path.join(work, "reuse.sh")
    with open(script, "w") as f:
        f.write(f"""set -u
B={BIN}; ok=0; reused=0; hit=0
for r in $(seq 20); do
  {sys.executable} {os.path.join(HERE, "mess.py")} plain --gb 1 --gpus 0 > {work}/m.out 2>/dev/null &
  m=$!
  for i in $(seq 600); do grep -q READY {work}/m.out && break; sleep 0.1; done
  $B --json holders --gpu 0 > {work}/h.json 2>/dev/null
  grep -q '"pid": '$m, {work}/h.json && ok=$((ok+1))
  kill -9 $m; wait $m 2>/dev/null
  echo $((m-1)) > /proc/sys/kernel/ns_last_pid
  sleep 1000 & s=$!
  [ "$s" = "$m" ] && reused=$((reused+1))
  $B eval 'kill(parse_json(read_file("{work}/h.json")).filter(|h| h.pid == '$m'), #{{grace: 5}})' > /dev/null 2>&1
  [ "$(awk '{{print $3}}' /proc/$s/stat 2>/dev/null)" = S ] || hit=$((hit+1))
  kill -9 $s; wait $s 2>/dev/null
done
echo "listed=$ok reused=$reused hit=$hit logged=$(cat {work}/signals.log 2>/dev/null | wc -l)"
""")
    env = dict(ENV, GPULOOP_SIGNAL_LOG=os.path.join(work, "signals.log"))
    rc, out, err, dt = sh(["unshare", "--pid", "--fork", "--mount-proc", "bash", script], timeout=400, env=env)
    last = out.strip().splitlines()[-1] if out.strip() else ""
    f = dict(kv.split("=") for kv in last.split()) if "=" in last else {}
    check("a recycled pid is never signalled: PyTorch holders listed, killed, pid reused, stale map killed (20 rounds)",
          rc == 0 and f.get("listed") == "20" and f.get("reused") == "20" and f.get("hit") == "0" and f.get("logged") == "0",
          result=last, seconds=round(dt, 1), rc=rc, err=err[-300:])


@scenario("pinned-tree")
def s_pinned_tree():
    """Issue 10 (hardening round 3): a bare pid's tree is pinned member by member, each checked
    to still be its parent's child through its own pidfd; and with nothing failing, every GPU
    record reads without an `error` field (the per-GPU fault path adds nothing)."""
    rc, out, err, dt = gl("--json", "gpus")
    g = json.loads(out) if rc == 0 and out.strip() else []
    check("pinned-tree: gpus exits 0 with every GPU read and no error field",
          rc == 0 and len(g) == NGPU and all("error" not in x for x in g),
          rc=rc, seconds=round(dt, 3), errors=[x.get("error") for x in g], err=err.strip()[-300:])
    p, info = mess("plain", "--gb", "4", "--gpus", "0", in_script=True)
    holder = info["pids"][0]
    rc, out, err, dt = gl("--json", "kill", str(p.pid), "--grace", "10")
    rep = json.loads(out) if out.strip() else {}
    freed = until(lambda: used_mib()[0] == 0, 30)
    check("pinned-tree: kill BASH_PID (bare pid) takes its PyTorch child through the pinned tree and GPU 0 frees",
          rc == 0 and p.pid in rep.get("signalled", []) and holder in rep.get("signalled", [])
          and not alive(holder) and freed,
          rc=rc, signalled=rep.get("signalled"), skipped=rep.get("skipped"), used=used_mib(),
          seconds=round(dt, 3), err=err.strip()[-300:])


# ------------------------------------------- real launchers: torchrun and DataLoader workers

def torchrun(*flags):
    """Real torchrun (its elastic agent) with one worker holding 4 GB on GPU 0."""
    return mess("torchrun-worker", "--gb", "4",
                launcher=["torchrun", "--standalone", "--nproc_per_node=1", "--monitor-interval=0.2", *flags])


def kill_gpu_holders():
    """Every process the driver lists (workers torchrun restarted are not in `started`)."""
    rc, out, _, _ = sh(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
    kill_pids([int(x) for x in out.split() if x.strip().isdigit()])


@scenario("torchrun-agent-killed")
def s_torchrun_agent_killed():
    """Real torchrun: the worker names its agent; with the agent SIGKILLed the worker (its own
    session, start_new_session=True) is orphaned, and clean frees it."""
    p, info = torchrun()
    agent, worker = p.pid, info["pids"][0]
    try:
        rc, table, err, _ = gl("holders")
        check("torchrun: the holders table names the agent for what it does",
              "torchrun agent" in table, table=table[-600:])
        d = gl_json("diagnose", "--gpu", "0")[0]
        check("torchrun: a stateless diagnose of its worker says the agent restarts it (--parents)",
              d["verdict"] in ("held", "respawning") and "torchrun" in d["advice"] and "--parents" in d["advice"],
              verdict=d["verdict"], advice=d["advice"])
        kill_pids([agent])
        until(lambda: ppid_of(worker) not in (agent, None), 20)
        d = gl_json("diagnose", "--gpu", "0")[0]
        check("torchrun: with the agent SIGKILLed the worker is orphaned", d["verdict"] == "orphaned",
              verdict=d["verdict"], advice=d["advice"], worker_ppid=ppid_of(worker))
        rc, total, released, overhead, out, err = timed_clean(("--gpu", "0"))
        check("torchrun: clean frees the orphaned worker (exit 0, 0 MiB)",
              rc == 0 and used_mib()[0] == 0 and not alive(worker),
              rc=rc, seconds=round(total, 3), overhead_ms=overhead and round(overhead, 1), err=err.strip()[-300:])
        rows.append(dict(scenario="real torchrun, agent SIGKILLed", verdict=d["verdict"],
                         gpuloop_clean=rc == 0, gpuloop_s=round(total, 3),
                         driver_release_s=round(released, 3) if released else None,
                         overhead_ms=round(overhead, 1) if overhead is not None else None,
                         one_liner_clean=None, one_liner_s=None))
    finally:
        kill_pids([agent])
        kill_gpu_holders()


@scenario("torchrun-restarts")
def s_torchrun_restarts():
    """Real torchrun --max-restarts=3: killing the worker alone gets it restarted (a new pid
    under the same agent), and a stateless diagnose says so; the agent maps the GPU itself, so
    clean takes it with its worker and the GPU stays clean."""
    p, info = torchrun("--max-restarts=3")
    agent, worker = p.pid, info["pids"][0]
    try:
        rc, out, err, dt = gl("kill", str(worker), "--grace", "5")
        back = until(lambda: any(h != worker for h in holder_pids(0) if ppid_of(h) == agent), 120)
        new = [h for h in holder_pids(0) if h != worker and ppid_of(h) == agent]
        check("torchrun --max-restarts: killing the worker alone gets a new worker from the agent",
              rc == 0 and back and not alive(worker), rc=rc, new=new, err=err.strip()[-300:])
        d = gl_json("diagnose", "--gpu", "0")[0]
        check("torchrun --max-restarts: diagnose of the new worker says the agent restarts it (--parents)",
              "torchrun" in d["advice"] and "--parents" in d["advice"],
              verdict=d["verdict"], advice=d["advice"])
        rc, out, err, dt = gl("clean", "--gpu", "0", "--timeout", "60", "--settle", "10")
        check("torchrun --max-restarts: clean takes the agent too (it maps the GPU) and GPU 0 stays clean",
              rc == 0 and until(lambda: not alive(agent), 15) and used_mib()[0] == 0,
              rc=rc, seconds=round(dt, 3), agent_alive=alive(agent), used=used_mib(), out=out[-500:])
    finally:
        kill_pids([agent])
        kill_gpu_holders()


@scenario("dataloader")
def s_dataloader():
    """Forked DataLoader workers busy in __getitem__ keep a SIGKILLed rank's CUDA context."""
    def build():
        p, info = mess("dataloader", "--gb", "6", "--gpus", "0")
        kill_pids([info["rank"]])
        until(lambda: not alive(info["rank"]), 10)
        return p, info
    clean_row("forked DataLoader workers of a SIGKILLed rank", build,
              lambda v: v[0] in ("inherited", "orphaned"))


# ------------------------------------------- recipes on the real shapes they are for

def recipe_row(name, recipe, build, extra=()):
    """Builds a mess, runs `gpuloop run RECIPE --gpu 0`, and checks it exits 0 with GPU 0 at
    0 MiB and none of the mess's processes left."""
    p, info = build()
    pids = [x for x in [p.pid, *info.get("pids", [])] if x]
    try:
        rc, out, err, dt = gl("run", recipe, "--gpu", "0", *extra, timeout=180)
        freed = until(lambda: used_mib()[0] == 0, 10)
        left = [x for x in info.get("pids", []) if alive(x)]
        check(f"recipe {recipe}: {name}: exit 0, GPU 0 at 0 MiB, none of its processes left",
              rc == 0 and freed and not left, rc=rc, seconds=round(dt, 3), left=left,
              used=used_mib(), out=out.strip()[-800:], err=err.strip()[-300:])
        rows.append(dict(scenario=f"recipe {recipe}: {name}", verdict="-", gpuloop_clean=rc == 0,
                         gpuloop_s=round(dt, 3), driver_release_s=None, overhead_ms=None,
                         one_liner_clean=None, one_liner_s=None))
    finally:
        kill_pids(pids)
        kill_gpu_holders()


@scenario("recipe-vllm")
def s_recipe_vllm():
    def build():
        p, info = mess("vllm", "--gb", "10", "--gpus", "0")
        kill_pids([info["api"]])
        return p, info
    recipe_row("vLLM-shaped, API server killed", "vllm", build)


@scenario("recipe-torchrun")
def s_recipe_torchrun():
    def build():
        p, info = torchrun("--max-restarts=3")
        info = dict(info, pids=[p.pid, *info["pids"]])
        return p, info
    recipe_row("real torchrun --max-restarts=3, agent and worker", "torchrun", build)


@scenario("recipe-dataloader")
def s_recipe_dataloader():
    def build():
        p, info = mess("dataloader", "--gb", "6", "--gpus", "0")
        kill_pids([info["rank"]])
        until(lambda: not alive(info["rank"]), 10)
        return p, info
    recipe_row("forked DataLoader workers of a SIGKILLed rank", "dataloader", build)


@scenario("recipe-preflight")
def s_recipe_preflight():
    """preflight on the real driver: a clean GPU passes with every check made (persistence
    mode as nvidia-smi reads it); a PyTorch holder, and another user's nvidia-smi loop, each
    fail it with one line."""
    rc, out, err, _ = gl("run", "preflight", "--gpu", "0", "--xid-window", "1")
    check("preflight: a clean GPU passes, every check made",
          rc == 0 and "persistence on" in out and "no recent Xid" in out and "not made" not in out,
          rc=rc, out=out.strip(), err=err.strip()[-300:])
    pm = sh("nvidia-smi --query-gpu=persistence_mode --format=csv,noheader")[1].split()
    g = gl_json("gpus")
    check("preflight: persistence mode as gpuloop reads it agrees with nvidia-smi",
          [x["faults"]["persistence_mode"] for x in g] == [m == "Enabled" for m in pm],
          gpuloop=[x["faults"]["persistence_mode"] for x in g], smi=pm)
    p, info = mess("plain", "--gb", "4", "--gpus", "0")
    try:
        rc, out, err, _ = gl("run", "preflight", "--gpu", "0", "--xid-window", "1")
        check("preflight: a PyTorch holder fails it with one line naming it",
              rc == 1 and "is not clean" in err and str(info["pids"][0]) in err and len(err.strip().splitlines()) == 1,
              rc=rc, err=err.strip())
    finally:
        kill_pids([p.pid, *info["pids"]])
        wait_free(20)
    obs = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            "nvidia-smi", "-lms", "200"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    started.append(obs.pid)
    try:
        until(lambda: any(h["role"] == "observer" for h in gl_json("holders", "--all")), 10)
        rc, out, err, _ = gl("run", "preflight", "--gpu", "0", "--xid-window", "1", "--user", "root")
        check("preflight: another user's nvidia-smi loop is a foreign observer (exit 1, one line)",
              rc == 1 and "nvidia-smi" in err and "not root" in err,
              rc=rc, out=out.strip(), err=err.strip())
    finally:
        kill_pids([obs.pid])


def main():
    log(f"{NGPU} GPU(s); gpuloop {gl('--version')[1].strip()}; driver:",
        sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")[1].strip())
    if not wait_free(30):
        log("GPUs are not free at the start:", used_mib())
    if ONLY:
        SCENARIOS.sort(key=lambda s: ONLY.index(s[0]))
    for name, fn in SCENARIOS:
        log(f"--- {name}")
        try:
            fn()
        except Exception as e:
            check(f"{name}: scenario ran", False, error=repr(e)[:800])
        finally:
            reset_between()
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(dict(ngpu=NGPU, checks=results, rows=rows), f, indent=1)
    md = ["| scenario | verdict before | gpuloop clean? | gpuloop s | driver release s | overhead ms | one-liner clean? | one-liner s |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['scenario']} | {r['verdict']} | {'yes' if r['gpuloop_clean'] else 'NO'} | {r['gpuloop_s']} | "
                  f"{r['driver_release_s']} | {r['overhead_ms']} | {'—' if r['one_liner_clean'] is None else 'yes' if r['one_liner_clean'] else 'NO'} | {r['one_liner_s'] or '—'} |")
    with open(os.path.join(OUT, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    log("\n".join(md))
    failed = [r["check"] for r in results if not r["ok"]]
    log(f"{len(results) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    try:
        main()
    finally:
        kill_pids(list(started))
