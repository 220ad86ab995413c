#!/usr/bin/env python3
"""Issue 33, item 6: a large host set, end to end, at 2,000, 16,000 and 65,536 hosts.

Each host is reached through an `ssh` of this script's on PATH that never answers (it execs
`sleep`): the run is in flight, its fan-out of ssh clients started and waiting, as with hosts
that hang. For each size, REPS times:
- usage error: `gpuloop --host h[1-N] holders --gpu zz:1` (a host not in the set), from
  start to exit 2 (nothing is contacted: no ssh may start);
- first ssh: from start until the first ssh client runs (parse, the pool's set-up);
- Ctrl-C: `gpuloop --host h[1-N] gpus`, SIGINT once 32 ssh clients run, to its exit
  (130), and whether any ssh client it started outlived it (by pid and start time).
In-process costs (parse, fold, the pool alone) are benches/hostset.rs's.

Every process it signals is its own child (gpuloop, by pid).
Usage: benches/hostset.py [BIN [OUT.json]]   (env: SIZES=2000,16000,65536 REPS=5)
"""
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gpuloop")
OUT = sys.argv[2] if len(sys.argv) > 2 else None
SIZES = [int(x) for x in os.environ.get("SIZES", "2000,16000,65536").split(",")]
REPS = int(os.environ.get("REPS", "5"))


def stat(pid):
    try:
        s = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    f = s[s.rindex(")") + 2:].split()
    return f[0], int(f[1]), int(f[19])  # state, ppid, start time


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = stat(int(d))
            if st and st[1] == pid:
                out.append((int(d), st[2]))
    return out


def running(pid, start):
    st = stat(pid)
    return st is not None and st[0] not in "ZX" and st[2] == start


def main():
    tmp = tempfile.mkdtemp(prefix="gpuloop-bench-hostset-")
    try:
        os.makedirs(f"{tmp}/bin")
        log = f"{tmp}/ssh.log"
        with open(f"{tmp}/bin/ssh", "w") as f:
            f.write(f"#!/bin/sh\necho started >> {log}\nexec sleep 600\n")
        os.chmod(f"{tmp}/bin/ssh", 0o755)
        os.makedirs(f"{tmp}/run", mode=0o700)
        env = dict(os.environ, PATH=f"{tmp}/bin:" + os.environ["PATH"],
                   XDG_RUNTIME_DIR=f"{tmp}/run")
        for v in ("GPULOOP_SIM", "GPULOOP_SIM_DIR"):
            env.pop(v, None)
        out = {"binary": BIN, "cores": os.cpu_count(), "load_before": os.getloadavg()[0],
               "sizes": []}
        for n in SIZES:
            usage, first, ctrl_c, left = [], [], [], 0
            for _ in range(REPS):
                t = time.monotonic()
                r = subprocess.run([BIN, "--host", f"h[1-{n}]", "holders", "--gpu", "zz:1"],
                                   env=env, capture_output=True)
                usage.append(time.monotonic() - t)
                if r.returncode != 2 or os.path.exists(log):
                    raise SystemExit(f"usage error at {n}: exit {r.returncode}, ssh started: "
                                     f"{os.path.exists(log)}")
                t = time.monotonic()
                p = subprocess.Popen([BIN, "--host", f"h[1-{n}]", "gpus"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                while not os.path.exists(log):
                    time.sleep(0.002)
                first.append(time.monotonic() - t)
                end = time.monotonic() + 120
                while len(kids := children(p.pid)) < 32 and time.monotonic() < end:
                    time.sleep(0.01)
                t = time.monotonic()
                p.send_signal(signal.SIGINT)  # our own child, by pid
                rc = p.wait()
                ctrl_c.append(time.monotonic() - t)
                if rc != 130:
                    raise SystemExit(f"Ctrl-C at {n}: exit {rc}")
                left += sum(running(k, s) for k, s in kids)
                os.unlink(log)
            med = lambda xs: round(statistics.median(xs) * 1e3, 1)
            row = {"hosts": n, "usage_error_exit_ms": med(usage),
                   "first_ssh_ms": med(first), "ctrl_c_to_exit_ms": med(ctrl_c),
                   "ctrl_c_to_exit_max_ms": round(max(ctrl_c) * 1e3, 1),
                   "ssh_clients_left": left}
            out["sizes"].append(row)
            print(json.dumps(row), flush=True)
        if OUT:
            with open(OUT, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
