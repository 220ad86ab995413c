#!/usr/bin/env python3
"""Several hosts on loopback: gpuloop's long-lived agents against pdsh and an ssh loop.

Starts a private OpenSSH server on 127.0.0.1 (throw-away keys, MaxStartups/MaxSessions raised
for 64 parallel connections) and 64 host aliases in a generated client config, each with its
own simulated 8x80G machine (SetEnv GPULOOP_SIM_DIR, AcceptEnv) and one holder. For each size
(1, 4, 16, 64 hosts) it measures:

- in one gpuloop session (`gpuloop --host h[01-N] eval`): the first connection (hosts()) and
  the per-call latency of gpu() and holders(), with the CPU time every process involved used
  per call (this gpuloop, its ssh clients, the sshd sessions, the agents), read from /proc
  between the phases;
- `gpuloop --host h[01-N] gpus --json` and `gpuloop --host h[01-N] clean` as one-shots (a new
  connection per host), clean with a holder on every host;
- the same query through `pdsh -R ssh -f 32` and a sequential `for h in ...; do ssh ...` loop
  (`gpuloop gpus --json` stands in for `nvidia-smi --query-gpu`; a new ssh connection per host
  per query, as those tools make).

TRANSPORTS=ssh,pipe (default both): `pipe` runs the same session with an `ssh` on PATH that
starts the agent directly as a child (same argv, same per-alias environment, no sshd, no
encryption): the client and agents' own cost without OpenSSH's. `TRANSPORTS=pipe` needs no
OpenSSH and no pdsh: the one-shots then go over the pipe too, and the pdsh and ssh-loop
baselines are left out.

Every process it signals is one it started and has not yet reaped (holders and sshd are its
own children, so their pids cannot be reused), and the temp dir goes even on failure.
Usage: benches/hosts.py [BIN [OUT.json]]   (the JSON goes to OUT.json, or to stdout)
(env: CALLS, REPS, SIZES, TRANSPORTS; ONLY_SESSIONS=1 skips the one-shots and baselines)
"""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gpuloop")
CALLS = int(os.environ.get("CALLS", "30"))
REPS = int(os.environ.get("REPS", "5"))
SIZES = [int(x) for x in os.environ.get("SIZES", "1,4,16,64").split(",")]
TRANSPORTS = os.environ.get("TRANSPORTS", "ssh,pipe").split(",")
OUT = sys.argv[2] if len(sys.argv) > 2 else None
# The one-shots connect afresh each time: over ssh when it is measured, else over the pipe.
ONESHOT = "ssh" if "ssh" in TRANSPORTS else "pipe"
HZ = os.sysconf("SC_CLK_TCK")
# Lets this script read /proc between the phases of a session; not counted in any figure.
SETTLE_S = 0.5


def sh(*a, **kw):
    return subprocess.run(a, check=True, capture_output=True, text=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats_ms(xs):
    """Median and spread (p10, p90, min, max) of seconds, in ms."""
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    r = lambda v: round(v * 1e3, 2)
    return {"median": r(statistics.median(xs)), "p10": r(q[0]), "p90": r(q[8]),
            "min": r(xs[0]), "max": r(xs[-1]), "n": len(xs)}


def cpu_tree(roots):
    """For each root pid: CPU seconds (user + system, live and exited threads) of the root
    itself, of all its descendants, and how many processes that tree has."""
    procs = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        f = s[s.rindex(")") + 2:].split()
        procs[int(d)] = (int(f[1]), (int(f[11]) + int(f[12])) / HZ)
    kids = {}
    for c, (pp, _) in procs.items():
        kids.setdefault(pp, []).append(c)
    out = {}
    for root in roots:
        seen, todo = set(), [root]
        while todo:
            p = todo.pop()
            if p in seen or p not in procs:
                continue
            seen.add(p)
            todo.extend(kids.get(p, []))
        own = procs[root][1] if root in procs else 0.0
        out[root] = (own, sum(procs[p][1] for p in seen) - own, len(seen))
    return out


class Bench:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuloop-bench-hosts-")
        self.holders = []  # Popen of `sim hold --foreground`: our children until reaped
        self.sshd = None
        self.session_proc = None  # a gpuloop session being measured (our unreaped child)

    def env_of(self, alias):
        return dict(os.environ, GPULOOP_SIM="8x80G", GPULOOP_SIM_DIR=f"{self.tmp}/sims/{alias}")

    def hold(self, alias):
        p = subprocess.Popen([BIN, "sim", "hold", "--gpu", "0", "--mib", "1000", "--foreground"],
                             env=self.env_of(alias), stdout=subprocess.PIPE, text=True)
        self.holders.append(p)
        line = p.stdout.readline().strip()
        if line != str(p.pid):
            raise SystemExit(f"sim hold on {alias} said {line!r}, expected its pid {p.pid}")

    def reap_holders(self):
        """Reaps the holders `clean` ended; SIGKILLs (by pid, still our unreaped child) any
        it did not."""
        left = 0
        for p in self.holders:
            if p.poll() is None:
                left += 1
                p.kill()
            p.wait()
            p.stdout.close()
        self.holders = []
        return left

    def setup(self):
        tmp = self.tmp
        self.port = free_port()
        if "ssh" in TRANSPORTS:  # a pipe-only run needs no OpenSSH at all
            for k in ("host_key", "id"):
                sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{tmp}/{k}")
            shutil.copy(f"{tmp}/id.pub", f"{tmp}/authorized_keys")
            with open(f"{tmp}/host_key.pub") as f:
                key = " ".join(f.read().split()[:2])
            with open(f"{tmp}/known_hosts", "w") as f:
                f.write(f"gpuloop-bench {key}\n")
        with open(f"{tmp}/sshd_config", "w") as f:
            f.write(f"""ListenAddress 127.0.0.1
HostKey {tmp}/host_key
PidFile {tmp}/sshd.pid
AuthorizedKeysFile {tmp}/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
AcceptEnv GPULOOP_SIM GPULOOP_SIM_DIR
MaxStartups 256
MaxSessions 256
LogLevel ERROR
# bash sources ~/.bashrc for a command sshd starts unless SHLVL says it is nested; this
# machine's runs `pyenv init` (~0.3 s a session). Every tool measured here goes through
# this sshd alike.
SetEnv SHLVL=1
""")
        user = sh("id", "-un").stdout.strip()
        self.cfg = f"{tmp}/ssh_config"
        with open(self.cfg, "w") as f:
            for i in range(1, max(SIZES) + 1):
                a = f"h{i:02d}"
                f.write(f"""Host {a}
  HostName 127.0.0.1
  Port {self.port}
  User {user}
  IdentityFile {tmp}/id
  IdentitiesOnly yes
  UserKnownHostsFile {tmp}/known_hosts
  GlobalKnownHostsFile /dev/null
  HostKeyAlias gpuloop-bench
  StrictHostKeyChecking yes
  LogLevel ERROR
  SetEnv GPULOOP_SIM=8x80G GPULOOP_SIM_DIR={tmp}/sims/{a}
""")
        # The `pipe` transport: gpuloop's ssh argv ends `-- DEST 'CMD'`; start CMD here with
        # the alias's environment, as sshd would there.
        os.makedirs(f"{tmp}/pipe-bin")
        with open(f"{tmp}/pipe-bin/ssh", "w") as f:
            f.write(f"""#!/bin/sh
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
GPULOOP_SIM=8x80G GPULOOP_SIM_DIR={tmp}/sims/$1; export GPULOOP_SIM GPULOOP_SIM_DIR
eval "exec $2"
""")
        os.chmod(f"{tmp}/pipe-bin/ssh", 0o755)
        if "ssh" not in TRANSPORTS:
            return
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation dir
        self.sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", f"{tmp}/sshd_config",
                                      "-p", str(self.port), "-E", f"{tmp}/sshd.log"])
        deadline = time.time() + 30
        while True:
            if self.sshd.poll() is not None:
                raise SystemExit("sshd exited: " + open(f"{tmp}/sshd.log").read())
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("sshd did not listen within 30 s")
                time.sleep(0.05)

    def teardown(self):
        try:
            p = self.session_proc
            if p is not None and p.poll() is None:
                p.terminate()  # gpuloop closes its agents and exits
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            self.reap_holders()
        finally:
            if self.sshd is not None and self.sshd.poll() is None:
                self.sshd.terminate()
                try:
                    self.sshd.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.sshd.kill()
                    self.sshd.wait()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def gl(self, transport):
        env = dict(os.environ)
        if transport == "pipe":
            env["PATH"] = f"{self.tmp}/pipe-bin:" + env["PATH"]
        return [BIN, "--ssh-config", self.cfg, "--remote-bin", BIN], env

    def timed(self, *cmd, env=None, ok=(0,)):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t
        if r.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)[:300]} exited {r.returncode}: {r.stderr[-2000:]}")
        return dt, r.stdout

    def session(self, transport, hosts, n):
        """One gpuloop session: first connection, CALLS gpu() then CALLS holders(); CPU time
        of each process tree read at the markers the script prints."""
        gl, env = self.gl(transport)
        script = f"""
            let t0 = now(); let hs = hosts(); let t1 = now();
            if hs.filter(|h| !h.reachable).len() > 0 {{ throw to_json(hs); }}
            print("MARK"); sleep({SETTLE_S});
            let g = []; for i in 0..{CALLS} {{ let a = now(); let x = gpu(); g.push(now() - a); }}
            print("MARK"); sleep({SETTLE_S});
            let h = []; for i in 0..{CALLS} {{ let a = now(); let x = holders(); h.push(now() - a); }}
            print("MARK"); sleep({SETTLE_S});
            print(to_json(#{{connect: t1 - t0, gpu: g, holders: h, gpus: gpu().len(), holders_n: holders().len()}}));
        """
        errf = open(f"{self.tmp}/session.err", "w+")
        p = subprocess.Popen([*gl, "--host", hosts, "eval", script], env=env,
                             stdout=subprocess.PIPE, stderr=errf, text=True)
        self.session_proc = p
        roots = [p.pid] + ([self.sshd.pid] if transport == "ssh" else [])
        marks = []
        for line in p.stdout:
            if line.strip() == "MARK":
                marks.append(cpu_tree(roots))
                continue
            last = line
        p.wait()
        self.session_proc = None
        errf.seek(0)
        err = errf.read()
        errf.close()
        if p.returncode != 0 or len(marks) != 3:
            raise SystemExit(f"session over {hosts} ({transport}) exited {p.returncode}: {err[-2000:]}")
        m = json.loads(last)
        if m["gpus"] != 8 * n or m["holders_n"] != n:
            raise SystemExit(f"session over {hosts}: {m['gpus']} GPUs, {m['holders_n']} holders")
        # gpuloop: the client process; children: its ssh clients (with `pipe`, the agents);
        # sshd: the sshd sessions and the agents under them.
        cpu = {}
        for phase, (a, b) in (("gpu", (marks[0], marks[1])), ("holders", (marks[1], marks[2]))):
            d = lambda r, i: b[r][i] - a[r][i]
            cpu[phase] = {"gpuloop": d(p.pid, 0), "children": d(p.pid, 1),
                          "sshd": d(self.sshd.pid, 1) if transport == "ssh" else 0.0,
                          "procs": sum(b[r][2] for r in roots)}
        return m, cpu

    def run(self):
        results = {"machine": {
            "cpus": os.cpu_count(),
            "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                         if l.startswith("model name")), "?"),
            "kernel": os.uname().release,
            "openssh": (subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
                        if shutil.which("ssh") else "not installed"),
            "pdsh": (subprocess.run(["pdsh", "-V"], capture_output=True, text=True).stdout.splitlines()[0]
                     if shutil.which("pdsh") else "not installed"),
            "loadavg_start": open("/proc/loadavg").read().split()[:3],
        }, "calls": CALLS, "reps": REPS, "bin": BIN, "sizes": {}}
        for n in SIZES:
            hosts = "h01" if n == 1 else f"h[01-{n:02d}]"
            aliases = [f"h{i:02d}" for i in range(1, n + 1)]
            row = {}
            for a in aliases:
                self.hold(a)
            for tr in TRANSPORTS:
                r = {"connect": [], "gpu": [], "holders": []}
                cpu = {ph: {"gpuloop": 0.0, "children": 0.0, "sshd": 0.0}
                       for ph in ("gpu", "holders")}
                for _ in range(REPS):
                    m, c = self.session(tr, hosts, n)
                    r["connect"].append(m["connect"])
                    r["gpu"].extend(m["gpu"])
                    r["holders"].extend(m["holders"])
                    for ph in cpu:
                        for k in ("gpuloop", "children", "sshd"):
                            cpu[ph][k] += c[ph][k]
                        cpu[ph]["procs"] = c[ph]["procs"]
                calls = CALLS * REPS
                row[tr] = {
                    "first_connection_ms": stats_ms(r["connect"]),
                    "gpu_call_ms": stats_ms(r["gpu"]),
                    "holders_call_ms": stats_ms(r["holders"]),
                    # CPU ms per call, all processes of the session together.
                    "cpu_ms_per_call": {ph: {k: (round(v / calls * 1e3, 3) if k != "procs" else v)
                                             for k, v in cpu[ph].items()} for ph in cpu},
                }
            if os.environ.get("ONLY_SESSIONS"):
                self.reap_holders()
                results["sizes"][n] = row
                print(n, json.dumps(row), file=sys.stderr, flush=True)
                continue
            gl, env = self.gl(ONESHOT)
            oneshot = [self.timed(*gl, "--host", hosts, "--json", "gpus", env=env)[0]
                       for _ in range(REPS)]
            clean = []
            for i in range(REPS):
                if i > 0:
                    for a in aliases:
                        self.hold(a)
                dt, out = self.timed(*gl, "--host", hosts, "clean", "--grace", "1", env=env)
                if n > 1 and f"{n} host(s): {n} clean" not in out:
                    raise SystemExit(f"clean over {hosts}: {out}")
                if self.reap_holders():
                    raise SystemExit(f"clean over {hosts} exited 0 but left a holder")
                clean.append(dt)
            row.update({
                "oneshot_transport": ONESHOT,
                "gpus_oneshot_ms": stats_ms(oneshot),
                "clean_oneshot_ms": stats_ms(clean),
                "loadavg_end": open("/proc/loadavg").read().split()[:3],
            })
            results["sizes"][n] = row
            print(n, json.dumps(row), file=sys.stderr, flush=True)
            if "ssh" not in TRANSPORTS:
                continue
            pdsh_env = dict(os.environ, PDSH_RCMD_TYPE="ssh",
                            PDSH_SSH_ARGS=f"-F {self.cfg} -o BatchMode=yes %h")
            query = f"{BIN} gpus --json >/dev/null"
            pdsh = [self.timed("pdsh", "-f", "32", "-w", hosts, query, env=pdsh_env)[0]
                    for _ in range(REPS)]
            loop = []
            for _ in range(REPS if n <= 16 else 2):
                t = time.perf_counter()
                for a in aliases:
                    sh("ssh", "-F", self.cfg, "-o", "BatchMode=yes", a, query)
                loop.append(time.perf_counter() - t)
            row.update({
                "pdsh_query_ms": stats_ms(pdsh),
                "ssh_loop_query_ms": stats_ms(loop),
                "loadavg_end": open("/proc/loadavg").read().split()[:3],
            })
            print(n, "baselines", json.dumps(row), file=sys.stderr, flush=True)
        return results


def stop(signum, _frame):
    raise SystemExit(f"stopped by signal {signum}")


# Started in the background, Python would ignore SIGINT: both signals end it through the
# `finally` below, so nothing it started is left behind.
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
b = Bench()
try:
    b.setup()
    res = b.run()
finally:
    b.teardown()
res["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
if OUT:
    with open(OUT, "w") as f:
        f.write(json.dumps(res, indent=1) + "\n")
else:
    print(json.dumps(res, indent=1))
