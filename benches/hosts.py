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
- with FLOOR=BIN (benches/fanout_floor.rs's binary), the floor under any client, per size and
  transport: the same agents answering `gpus` and `ping` to a client that only writes the
  request lines (from one thread, or 16 at once) and waits for the reply lines;
- the same query through `pdsh -R ssh -f 32` and a sequential `for h in ...; do ssh ...` loop
  (`gpuloop gpus --json` stands in for `nvidia-smi --query-gpu`; a new ssh connection per host
  per query, as those tools make). The one-shots and these baselines take turns: one trial of
  each per round, so load that comes and goes on a shared machine falls on all of them.

TRANSPORTS=ssh,pipe (default both): `pipe` runs the same session with an `ssh` on PATH that
starts the agent directly as a child (same argv, same per-alias environment, no sshd, no
encryption): the client and agents' own cost without OpenSSH's. `TRANSPORTS=pipe` needs no
OpenSSH and no pdsh: the one-shots then go over the pipe too, and the pdsh and ssh-loop
baselines are left out.

OPENSSH_BUNDLE=DIR (a bundle made by benches/openssh-bundle.sh DIR on a Debian 12 machine):
ssh, sshd, ssh-keygen and pdsh come from DIR, for a machine with no OpenSSH or pdsh (the GPU
bench machine). DIR/bin goes first on PATH and DIR/lib on LD_LIBRARY_PATH for everything this
script starts, gpuloop and the ssh it starts included (the target's own glibc; the sessions
sshd starts get a clean environment, so the agents run on the target's own libraries alone).
A first `ssh -v` login runs before anything is measured; any sshd failure quotes sshd's log
(-E). As root, sshd needs its privilege-separation user `sshd`: where it is missing, the bench
adds it (useradd, or a line appended to /etc/passwd) only if BENCH_MAY_ADD_SSHD_USER=1, and
says so on stderr and in the JSON (machine.sshd_user_added). As root, pdsh ignores
PDSH_MODULE_DIR and loads modules only from its compiled-in dir: where that is missing, the
bench makes it with the bundle's ssh module (and removes it at the end) only if
BENCH_MAY_ADD_PDSH_MODULES=1; otherwise the pdsh baseline is left out, saying why. sshd
without PAM refuses a locked account (shadow password `!...`) even with a key: as root, the
bench sets that field to `*` only if BENCH_MAY_UNLOCK_LOGIN=1 (machine.login_unlocked). If the
first login fails all the same, the error quotes the same login through `sshd -d`.

On the GPU bench machine (root, a Firecracker VM, no OpenSSH), from the repo root, carrying
`target/release/gpuloop` and `.bench-ssh` (made here by `benches/openssh-bundle.sh .bench-ssh`):
    benches/hosts-device.sh $OUT
that is, with REPS=4 CALLS=30 TRANSPORTS=ssh,pipe and the three BENCH_MAY_* set, under
`timeout -s TERM 570` (JSON in $OUT/hosts-ssh.json, stderr in $OUT/hosts-ssh.log).

OUT.json is also written after every size with "complete": false, so a run stopped by a time
limit keeps the sizes it finished; the last write says "complete": true.

Every process it signals is one it started and has not yet reaped (holders and sshd are its
own children, so their pids cannot be reused), and the temp dir goes even on failure.
Usage: benches/hosts.py [BIN [OUT.json]]   (the JSON goes to OUT.json, or to stdout)
(env: CALLS, REPS, SIZES, TRANSPORTS, FLOOR, OPENSSH_BUNDLE, BENCH_MAY_ADD_SSHD_USER,
BENCH_MAY_ADD_PDSH_MODULES, BENCH_MAY_UNLOCK_LOGIN; ONLY_SESSIONS=1 skips the one-shots and
baselines)
"""
import json, os, pwd, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback_sshd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipe_transport import write_pipe_ssh  # noqa: E402  (beside this file)

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gpuloop")
CALLS = int(os.environ.get("CALLS", "30"))
REPS = int(os.environ.get("REPS", "5"))
SIZES = [int(x) for x in os.environ.get("SIZES", "1,4,16,64").split(",")]
TRANSPORTS = os.environ.get("TRANSPORTS", "ssh,pipe").split(",")
OUT = sys.argv[2] if len(sys.argv) > 2 else None
# The one-shots connect afresh each time: over ssh when it is measured, else over the pipe.
ONESHOT = "ssh" if "ssh" in TRANSPORTS else "pipe"
HZ = os.sysconf("SC_CLK_TCK")
# FLOOR=BIN: also run benches/fanout_floor.rs's binary for each size and transport.
FLOOR = os.path.abspath(os.environ["FLOOR"]) if os.environ.get("FLOOR") else None
# OPENSSH_BUNDLE=DIR: ssh, sshd, ssh-keygen (and pdsh) from a benches/openssh-bundle.sh bundle.
BUNDLE = os.path.abspath(os.environ["OPENSSH_BUNDLE"]) if os.environ.get("OPENSSH_BUNDLE") else None
SSH, SSHD, KEYGEN, PDSH = "ssh", "/usr/sbin/sshd", "ssh-keygen", "pdsh"
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


def first_line(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return ((r.stdout + r.stderr).splitlines() or ["?"])[0]


def use_bundle():
    """Points every OpenSSH program this script and gpuloop start at the bundle: its bin/ first
    on PATH (gpuloop starts `ssh` from PATH), its lib/ on LD_LIBRARY_PATH (the target's own
    glibc, the bundle's other libraries), OPENSSL_CONF=/dev/null (the bundle's libcrypto does
    not read the target's openssl.cnf, written for another OpenSSL). sshd gives the sessions
    it starts a clean environment: the agents run with the target's own libraries."""
    global SSH, SSHD, KEYGEN, PDSH
    b = f"{BUNDLE}/bin"
    for prog in ("ssh", "sshd", "ssh-keygen"):
        if not os.access(f"{b}/{prog}", os.X_OK):
            raise SystemExit(f"OPENSSH_BUNDLE={BUNDLE}: no {b}/{prog}; make the bundle with "
                             f"benches/openssh-bundle.sh DIR on a machine with OpenSSH")
    try:
        manifest = dict(l.split(": ", 1) for l in open(f"{BUNDLE}/MANIFEST").read().splitlines())
    except (OSError, ValueError) as e:
        raise SystemExit(f"OPENSSH_BUNDLE={BUNDLE}: unreadable MANIFEST ({e})")
    here = os.confstr("CS_GNU_LIBC_VERSION") or "none"  # "glibc 2.39"
    ver = lambda v: tuple(int(x) for x in v.split("."))
    if not here.startswith("glibc ") or ver(here.split()[1]) < ver(manifest["glibc_min"]):
        raise SystemExit(f"OPENSSH_BUNDLE={BUNDLE} needs glibc >= {manifest['glibc_min']}, "
                         f"this machine has {here}")
    SSH, SSHD, KEYGEN = f"{b}/ssh", f"{b}/sshd", f"{b}/ssh-keygen"
    # sshd re-execs itself by its argv[0]: it must be an absolute path.
    PDSH = f"{b}/pdsh" if os.access(f"{b}/pdsh", os.X_OK) else None
    os.environ["PATH"] = f"{b}:" + os.environ.get("PATH", "/usr/bin:/bin")
    lib = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = f"{BUNDLE}/lib" + (f":{lib}" if lib else "")
    os.environ["OPENSSL_CONF"] = "/dev/null"
    return manifest


def sshd_user():
    """As root, sshd needs its privilege-separation user `sshd` (it chroots to /run/sshd and
    drops to that user before authentication). Adds it only where BENCH_MAY_ADD_SSHD_USER=1
    says this machine is a throw-away one; says what it did. Returns what was done, or None."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("sshd")
        return None
    except KeyError:
        pass
    if os.environ.get("BENCH_MAY_ADD_SSHD_USER") != "1":
        raise SystemExit("sshd runs as root here and needs its privilege-separation user "
                         "`sshd`, which this machine lacks. On a throw-away machine, "
                         "BENCH_MAY_ADD_SSHD_USER=1 lets this bench add it; or add it yourself "
                         "(useradd --system --no-create-home --home-dir /run/sshd sshd). "
                         "TRANSPORTS=pipe measures without OpenSSH.")
    if shutil.which("useradd"):
        r = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/run/sshd",
                            "--shell", "/usr/sbin/nologin", "sshd"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"useradd sshd exited {r.returncode}: {r.stderr.strip()}")
        did = f"added user sshd (uid {pwd.getpwnam('sshd').pw_uid}) with useradd --system"
    else:
        used = {p.pw_uid for p in pwd.getpwall()}
        uid = next(u for u in range(999, 99, -1) if u not in used)
        with open("/etc/passwd", "a") as f:
            f.write(f"sshd:x:{uid}:65534::/run/sshd:/usr/sbin/nologin\n")
        did = f"appended sshd:x:{uid}:65534::/run/sshd:/usr/sbin/nologin to /etc/passwd (no useradd)"
    print(f"hosts.py: BENCH_MAY_ADD_SSHD_USER=1: {did}: sshd's privilege-separation user",
          file=sys.stderr, flush=True)
    return did


def login_unlocked(user):
    """Without PAM (UsePAM no), sshd refuses a user whose shadow password field starts with
    `!` (a locked account; `*` is not one), even for a key: as root, finds that out before
    sshd does. Where BENCH_MAY_UNLOCK_LOGIN=1 says this machine is a throw-away one, sets the
    field to `*` (still no password login); says what it did. Returns what was done, or None."""
    if os.geteuid() != 0 or not os.path.exists("/etc/shadow"):
        return None
    with open("/etc/shadow") as f:
        lines = f.read().splitlines(keepends=True)
    for i, l in enumerate(lines):
        f = l.split(":")
        if f[0] == user and len(f) > 1 and f[1].startswith("!"):
            break
    else:
        return None
    if os.environ.get("BENCH_MAY_UNLOCK_LOGIN") != "1":
        raise SystemExit(f"{user}'s account is locked (its /etc/shadow password starts with '!'): "
                         "sshd without PAM refuses it even with a key. On a throw-away machine, "
                         "BENCH_MAY_UNLOCK_LOGIN=1 lets this bench set that field to '*' (no "
                         f"password login either); or run `usermod -p '*' {user}`. "
                         "TRANSPORTS=pipe measures without OpenSSH.")
    f[1] = "*"
    lines[i] = ":".join(f)
    with open("/etc/shadow", "w") as out:
        out.write("".join(lines))
    did = f"set {user}'s locked /etc/shadow password field to '*'"
    print(f"hosts.py: BENCH_MAY_UNLOCK_LOGIN=1: {did} (sshd without PAM refuses a locked account)",
          file=sys.stderr, flush=True)
    return did


class Bench:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuloop-bench-hosts-")
        self.holders = []  # Popen of `sim hold --foreground`: our children until reaped
        self.sshd = None
        self.session_proc = None  # a gpuloop session being measured (our unreaped child)
        self.made_pdsh_dir = None  # a pdsh module dir this run made (removed at the end)
        self.pdsh_skipped = None

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
            loopback_sshd.write(tmp, "gpuloop-bench", KEYGEN)
        user = sh("id", "-un").stdout.strip()
        self.cfg = f"{tmp}/ssh_config"
        with open(self.cfg, "w") as f:
            for i in range(1, max(SIZES) + 1):
                a = f"h{i:02d}"
                f.write(loopback_sshd.host(a, self.port, user, tmp, "gpuloop-bench",
                                           f"GPULOOP_SIM=8x80G GPULOOP_SIM_DIR={tmp}/sims/{a}"))
        write_pipe_ssh(tmp)  # the `pipe` transport
        if "ssh" not in TRANSPORTS:
            return
        self.added_sshd_user = sshd_user()
        self.unlocked_login = login_unlocked(user)
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self.sshd = subprocess.Popen([SSHD, "-D", "-f", f"{tmp}/sshd_config",
                                      "-p", str(self.port), "-E", f"{tmp}/sshd.log"])
        deadline = time.time() + 30
        while True:
            if self.sshd.poll() is not None:
                raise SystemExit(f"sshd exited {self.sshd.returncode}" + self.sshd_log())
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("sshd did not listen within 30 s" + self.sshd_log())
                time.sleep(0.05)
        # One login before anything is measured: a failure (keys, the privilege-separation
        # user, a sandbox that refuses what sshd does) shows here with both sides' words.
        try:
            r = subprocess.run([SSH, "-v", "-F", self.cfg, "-o", "BatchMode=yes",
                                "-o", "ConnectTimeout=30", "h01", "echo ok"],
                               capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise SystemExit("a first ssh login to the bench's sshd took over 120 s"
                             + self.login_diagnosis() + self.sshd_log())
        if r.returncode != 0 or r.stdout.strip() != "ok":
            raise SystemExit(f"a first ssh login to the bench's sshd failed (exit {r.returncode}, "
                             f"stdout {r.stdout.strip()!r}); ssh -v said:\n{r.stderr[-3000:]}"
                             + self.login_diagnosis() + self.sshd_log())
        if PDSH is not None and BUNDLE is not None and not os.environ.get("ONLY_SESSIONS"):
            self.pdsh_modules()

    def pdsh_modules(self):
        """Lets the bundle's pdsh find its ssh module. pdsh checks the directory it loads
        modules from (owner root or the user, not world-writable, up to /). Not as root, it
        takes PDSH_MODULE_DIR: a copy in our own temp dir. As root it ignores that and loads
        from its compiled-in directory (MANIFEST's pdsh_module_dir): one that holds an
        sshcmd.so is used as it is; a missing one is made, with the bundle's module, only where
        BENCH_MAY_ADD_PDSH_MODULES=1 says so, and removed at the end. Otherwise the pdsh
        baseline is left out (self.pdsh_skipped says why)."""
        global PDSH
        if os.geteuid() != 0:
            os.makedirs(f"{self.tmp}/pdsh-modules", mode=0o755)
            shutil.copy(f"{BUNDLE}/lib/pdsh/sshcmd.so", f"{self.tmp}/pdsh-modules/")
            os.environ["PDSH_MODULE_DIR"] = f"{self.tmp}/pdsh-modules"
            return
        d = MANIFEST.get("pdsh_module_dir", "")
        why = None
        if not d:
            why = "the bundle's MANIFEST names no pdsh_module_dir"
        elif os.path.exists(f"{d}/sshcmd.so"):
            print(f"hosts.py: the bundle's pdsh (as root) loads this machine's {d}/sshcmd.so",
                  file=sys.stderr, flush=True)
        elif os.path.exists(d):
            why = f"{d} (pdsh's compiled-in module dir) exists without sshcmd.so"
        elif os.environ.get("BENCH_MAY_ADD_PDSH_MODULES") != "1":
            why = (f"as root pdsh loads modules only from {d}, which this machine lacks; "
                   "BENCH_MAY_ADD_PDSH_MODULES=1 lets the bench make it for the run")
        else:
            top = d
            while not os.path.exists(os.path.dirname(top)):
                top = os.path.dirname(top)
            os.makedirs(d, mode=0o755)
            self.made_pdsh_dir = top
            shutil.copy(f"{BUNDLE}/lib/pdsh/sshcmd.so", f"{d}/")
            print(f"hosts.py: BENCH_MAY_ADD_PDSH_MODULES=1: made {d} with the bundle's sshcmd.so "
                  f"(pdsh's compiled-in module dir); {top} goes at the end",
                  file=sys.stderr, flush=True)
        if why:
            print(f"hosts.py: no pdsh baseline: {why}", file=sys.stderr, flush=True)
            self.pdsh_skipped = why
            PDSH = None

    def login_diagnosis(self):
        """After a failed first login, one more through a debugging sshd (-d: one connection,
        in the foreground, its log on stderr), whose words say why: the bench's own sshd logs
        only errors, and a refused login is not one."""
        port, log = free_port(), f"{self.tmp}/sshd-debug.log"
        with open(log, "w") as f:
            d = subprocess.Popen([SSHD, "-d", "-e", "-f", f"{self.tmp}/sshd_config",
                                  "-p", str(port), "-o", "LogLevel=DEBUG1"],
                                 stdout=subprocess.DEVNULL, stderr=f)
        try:
            # Its one connection is the login: wait for its word that it listens, no probe.
            deadline = time.time() + 10
            while d.poll() is None and time.time() < deadline:
                with open(log) as f:
                    if "Server listening" in f.read():
                        subprocess.run([SSH, "-F", self.cfg, "-p", str(port), "-o",
                                        "BatchMode=yes", "-o", "ConnectTimeout=20", "h01",
                                        "echo ok"], capture_output=True, timeout=60)
                        break
                time.sleep(0.05)
        except subprocess.TimeoutExpired:
            pass
        finally:
            if d.poll() is None:
                d.terminate()
                try:
                    d.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    d.kill()
                    d.wait()
        with open(log) as f:
            return f"\nthe same login through `sshd -d` said:\n{f.read()[-4000:].strip()}"

    def sshd_log(self):
        """The end of sshd's log (-E), to quote in a failure, with the way around it."""
        try:
            with open(f"{self.tmp}/sshd.log") as f:
                log = f.read()[-3000:].strip() or "(empty)"
        except OSError as e:
            log = f"(unreadable: {e})"
        return (f"\nsshd ({SSHD}) log:\n{log}\n(without a working sshd here, TRANSPORTS=pipe "
                "still measures the sessions without OpenSSH)")

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
            if self.made_pdsh_dir:
                shutil.rmtree(self.made_pdsh_dir, ignore_errors=True)

    def gl(self, transport):
        env = dict(os.environ)
        if transport == "pipe":
            env["PATH"] = f"{self.tmp}/pipe-bin:" + env["PATH"]
        # --no-reuse: a new connection per host per one-shot, as described above
        # (benches/fleet.py measures the kept ones).
        return [BIN, "--ssh-config", self.cfg, "--remote-bin", BIN, "--no-reuse"], env

    def timed(self, *cmd, env=None, ok=(0,)):
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        dt = time.perf_counter() - t
        if r.returncode not in ok:
            raise SystemExit(f"{' '.join(cmd)[:300]} exited {r.returncode}: {r.stderr[-2000:]}"
                             + (self.sshd_log() if self.sshd is not None else ""))
        return dt, r.stdout

    def floor(self, transport, n):
        """benches/fanout_floor.rs over the same transport and agents: the round trip of a
        client that only writes the request lines and waits for the reply lines."""
        _, env = self.gl(transport)
        out = {}
        # One thread writes every request, or 16 at once (gpuloop's shards, at most 16).
        for method, writers in (("gpus", 1), ("gpus", 16), ("ping", 16)):
            r = subprocess.run([FLOOR, self.cfg, BIN, str(CALLS * REPS), method, str(n)],
                               capture_output=True, text=True,
                               env=dict(env, WRITERS=str(writers)))
            if r.returncode != 0:
                raise SystemExit(f"fanout_floor over {n} hosts ({transport}) exited "
                                 f"{r.returncode}: {r.stderr[-2000:]}")
            out[f"{method}_{writers}_writers"] = json.loads(r.stdout)
        return out

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
            raise SystemExit(f"session over {hosts} ({transport}) exited {p.returncode}: {err[-2000:]}"
                             + (self.sshd_log() if transport == "ssh" else ""))
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
            "openssh": (subprocess.run([SSH, "-V"], capture_output=True, text=True).stderr.strip()
                        if shutil.which(SSH) else "not installed"),
            "pdsh": (first_line(PDSH, "-V") if PDSH and shutil.which(PDSH)
                     else self.pdsh_skipped or "not installed"),
            "openssh_bundle": MANIFEST,
            "glibc": os.confstr("CS_GNU_LIBC_VERSION"),
            "sshd_user_added": getattr(self, "added_sshd_user", None),
            "login_unlocked": getattr(self, "unlocked_login", None),
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
                    **({"floor": self.floor(tr, n)} if FLOOR else {}),
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
                save(results, complete=False)
                continue
            gl, env = self.gl(ONESHOT)
            pdsh_env = dict(os.environ, PDSH_RCMD_TYPE="ssh",
                            PDSH_SSH_ARGS=f"-F {self.cfg} -o BatchMode=yes %h")
            query = f"{BIN} gpus --json >/dev/null"
            # The baselines (over ssh only): a bundle made where pdsh is not installed has
            # none, and as root pdsh may find no module (pdsh_modules): the ssh loop stays.
            baselines = "ssh" in TRANSPORTS
            use_pdsh = baselines and PDSH and shutil.which(PDSH)
            oneshot, clean, pdsh, loop = [], [], [], []
            # One trial of each per round, in turn (a noisy moment falls on all of them);
            # the sequential ssh loop over more than 16 hosts only in the first two rounds.
            for i in range(REPS):
                oneshot.append(self.timed(*gl, "--host", hosts, "--json", "gpus", env=env)[0])
                if use_pdsh:
                    pdsh.append(self.timed(PDSH, "-f", "32", "-w", hosts, query, env=pdsh_env)[0])
                if baselines and (n <= 16 or i < 2):
                    t = time.perf_counter()
                    for a in aliases:
                        sh(SSH, "-F", self.cfg, "-o", "BatchMode=yes", a, query)
                    loop.append(time.perf_counter() - t)
                if i > 0:
                    for a in aliases:
                        self.hold(a)
                dt, out = self.timed(*gl, "--host", hosts, "clean", "--grace", "1", env=env)
                if n > 1 and f"{n} hosts: {n} clean" not in out:
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
            if baselines:
                row.update({
                    "pdsh_query_ms": stats_ms(pdsh) if pdsh else f"left out: {self.pdsh_skipped or 'no pdsh (not installed, or not in the bundle)'}",
                    "ssh_loop_query_ms": stats_ms(loop),
                })
            results["sizes"][n] = row
            print(n, json.dumps(row), file=sys.stderr, flush=True)
            save(results, complete=False)
        return results


def save(res, complete):
    """Writes OUT.json; also after every size (complete: false), so a run stopped by a time
    limit keeps the sizes it finished."""
    res["complete"] = complete
    if OUT:
        with open(OUT, "w") as f:
            f.write(json.dumps(res, indent=1) + "\n")
    elif complete:
        print(json.dumps(res, indent=1))


def stop(signum, _frame):
    raise SystemExit(f"stopped by signal {signum}")


# Started in the background, Python would ignore SIGINT: both signals end it through the
# `finally` below, so nothing it started is left behind.
signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
MANIFEST = use_bundle() if BUNDLE else None
b = Bench()
try:
    b.setup()
    res = b.run()
finally:
    b.teardown()
res["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
save(res, complete=True)
