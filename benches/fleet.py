#!/usr/bin/env python3
"""gpuloop over N loopback hosts beside pdsh and ClusterShell, side by side in one run.

Starts a private OpenSSH server on 127.0.0.1 (throw-away keys) and N host aliases in a
generated client config, each with its own simulated 8x80G machine (SetEnv GPULOOP_SIM_DIR).
For each size (SIZES, default 16,64), REPS rounds (default 7) of one trial of each, every other
round in the opposite order:

- gpuloop first run: `gpuloop --host h[01-N] --json gpus` with no kept connection (a fresh
  XDG_RUNTIME_DIR each time): N ssh handshakes;
- gpuloop repeated run: the same, again, right after it, through the connections the run
  before kept (OpenSSH ControlMaster, the default for one-shots);
- gpuloop without kept connections (`--no-reuse`, what every run paid before);
- gpuloop diagnose, first and repeated, the same way;
- pdsh: `pdsh -R ssh -f 32 -w h[01-N] 'BIN gpus --json'` (a new ssh connection per host);
- clush: `clush -f 32 -w h[01-N] -o '-F CONFIG' 'BIN gpus --json'` (ditto).

Each as a median (and min, max) in ms, with its ratio to pdsh's median. The kept masters are
ended (`ssh -O exit`) and the holders, sshd and temp dir removed at the end, even on failure.
Every process it signals is one it started.

BEFORE=BIN2 adds another gpuloop's first run (`gpus_first_before`) to each round, beside this
one's: a change measured before and after in one run, trials interleaved.

LOAD=N makes the machine busy for the whole run: N busy loops (`while True: pass`), each in a
session of its own (LOAD_SESSIONS=each, the default: N jobs of N users, each its own group
under the kernel's per-session scheduling) or all in one (LOAD_SESSIONS=one: one job of N
workers), started before the first round and SIGKILLed by pid at the end. The JSON says which
(machine.load).

Needs: /usr/sbin/sshd, ssh, ssh-keygen; pdsh and clush (apt: pdsh, clustershell) or their
rows say "not installed". Without LOAD, figures are only worth writing down on a quiet machine:
the JSON carries the core count, whether autogroup scheduling is on, and the load average
before and after.

Usage: benches/fleet.py [BIN [OUT.json]]
(env: SIZES=16,64 REPS=7 BEFORE LOAD LOAD_SESSIONS ROWS=gpus_first,gpus_first_before,pdsh,…)
"""
import glob, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback_sshd  # noqa: E402

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gpuloop")
OUT = sys.argv[2] if len(sys.argv) > 2 else None
SIZES = [int(x) for x in os.environ.get("SIZES", "16,64").split(",")]
REPS = int(os.environ.get("REPS", "7"))
BEFORE = os.path.abspath(os.environ["BEFORE"]) if os.environ.get("BEFORE") else None
LOAD = int(os.environ.get("LOAD", "0"))
# ROWS=gpus_first,pdsh,…: only those rows (the first and repeated runs of a command go
# together); by default every row.
ROWS = set(os.environ["ROWS"].split(",")) if os.environ.get("ROWS") else None


def wanted(*rows):
    return ROWS is None or any(r in ROWS for r in rows)
LOAD_SESSIONS = os.environ.get("LOAD_SESSIONS", "each")

# One busy loop; with LOAD_SESSIONS=one, the first forks the others (one session for all) and
# prints every pid.
SPIN = """
import os, sys
n = int(sys.argv[1])
pids = [os.getpid()]
for _ in range(n - 1):
    pid = os.fork()
    if pid == 0:
        pids = None
        break
    pids.append(pid)
if pids:
    print(" ".join(map(str, pids)), flush=True)
while True:
    pass
"""


def start_load():
    """The busy loops: their pids (every one our child or our child's child, never reaped by
    anyone else before we kill it: the forked ones' parent is the first, which outlives them
    until the end)."""
    if LOAD <= 0:
        return [], []
    if LOAD_SESSIONS == "one":
        p = subprocess.Popen([sys.executable, "-c", SPIN, str(LOAD)], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
        return [p], [int(x) for x in p.stdout.readline().split()]
    ps = [subprocess.Popen([sys.executable, "-c", SPIN, "1"], stdout=subprocess.DEVNULL,
                           start_new_session=True) for _ in range(LOAD)]
    return ps, [p.pid for p in ps]


def stop_load(ps, pids):
    # The forked loops first (children of the first, which is still there to reap them),
    # then our own children, by pid, and reaped.
    for pid in pids:
        if pid not in [p.pid for p in ps]:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    for p in ps:
        p.kill()
        p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env=None, ok=(0,)):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = (time.perf_counter() - t) * 1e3
    if r.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd)[:300]} exited {r.returncode}: {r.stderr[-2000:]}")
    return dt


def stats(xs):
    return {"median": round(statistics.median(xs), 1), "min": round(min(xs), 1),
            "max": round(max(xs), 1), "n": len(xs)}


def main():
    tmp = tempfile.mkdtemp(prefix="gpuloop-fleet-")
    sshd = None
    runtime_dirs = []
    load = ([], [])
    try:
        port = free_port()
        loopback_sshd.write(tmp, "gpuloop-fleet")
        user = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        cfg = f"{tmp}/ssh_config"
        with open(cfg, "w") as f:
            for i in range(1, max(SIZES) + 1):
                a = f"h{i:02d}"
                f.write(loopback_sshd.host(a, port, user, tmp, "gpuloop-fleet",
                                           f"GPULOOP_SIM=8x80G GPULOOP_SIM_DIR={tmp}/sims/{a}"))
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", f"{tmp}/sshd_config",
                                 "-p", str(port), "-E", f"{tmp}/sshd.log"])
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or sshd.poll() is not None:
                    raise SystemExit("sshd did not start: " + open(f"{tmp}/sshd.log").read())
                time.sleep(0.05)
        base = dict(os.environ)
        base.pop("GPULOOP_SIM", None)
        base.pop("GPULOOP_SIM_DIR", None)

        def fresh_runtime():
            d = tempfile.mkdtemp(prefix="glf-")
            runtime_dirs.append(d)
            return dict(base, XDG_RUNTIME_DIR=d)

        gl = [BIN, "--ssh-config", cfg, "--remote-bin", BIN]
        query = f"{BIN} gpus --json >/dev/null"
        autogroup = open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() \
            if os.path.exists("/proc/sys/kernel/sched_autogroup_enabled") else "absent"
        loadavg_before = open("/proc/loadavg").read().split()[:3]
        load = start_load()
        res = {"machine": {"cores": os.cpu_count(),
                           "cpu": next((l.split(":", 1)[1].strip()
                                        for l in open("/proc/cpuinfo")
                                        if l.startswith("model name")), "?"),
                           "kernel": os.uname().release,
                           "sched_autogroup_enabled": autogroup,
                           "load": {"busy_loops": LOAD, "sessions": LOAD_SESSIONS}
                           if LOAD else "none of the bench's own",
                           "loadavg_start": loadavg_before,
                           "before": BEFORE,
                           "gpuloop": subprocess.run([BIN, "--version"], capture_output=True,
                                                     text=True).stdout.strip(),
                           "pdsh": shutil.which("pdsh") or "not installed",
                           "clush": shutil.which("clush") or "not installed"},
               "reps": REPS, "sizes": {}}
        for n in SIZES:
            hosts = f"h[01-{n:02d}]"
            times = {k: [] for k in ("gpus_no_reuse", "gpus_first", "gpus_first_before",
                                     "gpus_repeated", "diagnose_first", "diagnose_repeated",
                                     "pdsh", "clush")}
            def first(binary, row):
                env = fresh_runtime()
                times[row].append(run([binary, *gl[1:], "--host", hosts, "--json", "gpus"], env))
                # The repeated run right after, through the connections this one kept.
                if row == "gpus_first" and wanted("gpus_repeated"):
                    times["gpus_repeated"].append(
                        run([*gl, "--host", hosts, "--json", "gpus"], env))
                end_masters(env["XDG_RUNTIME_DIR"], cfg)

            def diagnose():
                env = fresh_runtime()
                times["diagnose_first"].append(run([*gl, "--host", hosts, "--json", "diagnose"], env))
                times["diagnose_repeated"].append(
                    run([*gl, "--host", hosts, "--json", "diagnose"], env))
                end_masters(env["XDG_RUNTIME_DIR"], cfg)

            trials = []
            if BEFORE and wanted("gpus_first_before"):
                trials.append(lambda: first(BEFORE, "gpus_first_before"))
            if wanted("gpus_first", "gpus_repeated"):
                trials.append(lambda: first(BIN, "gpus_first"))
            if wanted("gpus_no_reuse"):
                trials.append(lambda: times["gpus_no_reuse"].append(run(
                    [*gl, "--host", hosts, "--no-reuse", "--json", "gpus"], fresh_runtime())))
            if wanted("diagnose_first", "diagnose_repeated"):
                trials.append(diagnose)
            if shutil.which("pdsh") and wanted("pdsh"):
                env = dict(base, PDSH_RCMD_TYPE="ssh",
                           PDSH_SSH_ARGS=f"-F {cfg} -o BatchMode=yes %h")
                trials.append(lambda: times["pdsh"].append(
                    run(["pdsh", "-f", "32", "-w", hosts, query], env)))
            if shutil.which("clush") and wanted("clush"):
                trials.append(lambda: times["clush"].append(run(
                    ["clush", "-f", "32", "-w", hosts, "-o", f"-F {cfg} -o BatchMode=yes",
                     query], base)))
            # One trial of each per round, so that a noisy moment hits every tool alike;
            # every other round backward, so that none always runs right after another.
            for r in range(REPS):
                for t in (trials if r % 2 == 0 else trials[::-1]):
                    t()
            row = {k: stats(v) for k, v in times.items() if v}
            ref = row.get("pdsh", {}).get("median")
            if ref:
                for k, v in row.items():
                    v["ratio_to_pdsh"] = round(v["median"] / ref, 2)
            row["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
            res["sizes"][n] = row
            print(n, json.dumps(row), file=sys.stderr, flush=True)
        text = json.dumps(res, indent=1)
        if OUT:
            open(OUT, "w").write(text + "\n")
        else:
            print(text)
    finally:
        stop_load(*load)
        for d in runtime_dirs:
            end_masters(d, cfg if os.path.exists(f"{tmp}/ssh_config") else None)
            shutil.rmtree(d, ignore_errors=True)
        if sshd is not None:
            sshd.terminate()
            sshd.wait()
        # The simulated holders are none: nothing here holds a GPU; the state dirs go.
        shutil.rmtree(tmp, ignore_errors=True)


def end_masters(runtime_dir, cfg):
    """Ends every ssh master gpuloop kept under this XDG_RUNTIME_DIR (by its socket)."""
    for sock in glob.glob(f"{runtime_dir}/gpuloop/*"):
        cmd = ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "h01"]
        if cfg:
            cmd[1:1] = ["-F", cfg]
        subprocess.run(cmd, capture_output=True)


if __name__ == "__main__":
    main()
