#!/usr/bin/env python3
"""Issue 33, item 3: what gpuloop pays to bring itself to hosts that lack it, on loopback.

Starts a private OpenSSH server on 127.0.0.1 (benches/loopback_sshd.py: throw-away keys) and
HOSTS host aliases h01..hNN, each with its own simulated 8x80G machine and its own cache
directory (`SetEnv XDG_CACHE_HOME=…`, so each alias is a machine that receives its own copy)
and a PATH without gpuloop. The one-shot measured is `gpuloop --host h[01-NN] gpus --json`,
with gpuloop's kept connections in a private XDG_RUNTIME_DIR. It measures:

- first: every cache empty and no kept connection (the copy is sent, gzipped, hashed once
  where it is stored); COLD runs, the caches and kept connections removed before each;
- repeat: REPS runs right after a first one (the copies and their `.id` sidecars are
  there, the connections kept by the first run are reused): the median, and repeat/first;
- repeat, new connections (`--no-reuse`): the same copies, a new ssh session each;
- repeat, new connections, every copy hashed (its `.id` removed before each run): what every
  connection paid before the hash was kept (issue 33 measured 2.83 s, then 2.84 s);
- bytes sent to each host by a first run, counted on the wire: each alias then points at a
  relay of this script's that forwards to sshd and counts the bytes from the client (the
  SSH stream: the compressed binary, the key exchange, the requests); the binary's size and
  its gzip -1 size beside them;
- what a user would run instead, with the same sshd and hosts, all hosts at once (as
  `pdsh -f 32` would; pdsh itself is used where installed): `scp` of the binary to every
  host and then `ssh HOST BIN gpus --json` on each (first), then the `ssh` alone (repeat),
  each trial taking its turn beside gpuloop's (first beside first, repeat beside repeat).

Every process it signals is its own child (sshd, the relays' sockets are threads); kept
connections are ended with `ssh -O exit` and the temp dir goes at the end.
Usage: benches/push.py [BIN [OUT.json]]   (env: HOSTS=16, REPS=10, COLD=3)
"""
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback_sshd  # noqa: E402

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gpuloop")
OUT = sys.argv[2] if len(sys.argv) > 2 else None
HOSTS = int(os.environ.get("HOSTS", "16"))
REPS = int(os.environ.get("REPS", "10"))
COLD = int(os.environ.get("COLD", "3"))
ALIASES = [f"h{i:02d}" for i in range(1, HOSTS + 1)]
EXPR = f"h[01-{HOSTS:02d}]"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Relay:
    """127.0.0.1:port -> sshd, counting the bytes the client sends (all its connections)."""

    def __init__(self, to):
        self.to, self.sent = to, 0
        self.lock = threading.Lock()
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.to))
            threading.Thread(target=self.pipe, args=(c, s, True), daemon=True).start()
            threading.Thread(target=self.pipe, args=(s, c, False), daemon=True).start()

    def pipe(self, a, b, counted):
        try:
            while True:
                d = a.recv(1 << 16)
                if not d:
                    break
                if counted:
                    with self.lock:
                        self.sent += len(d)
                b.sendall(d)
        except OSError:
            pass
        finally:
            for x in (a, b):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class Bench:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="gpuloop-bench-push-")
        self.sshd = None
        self.port = free_port()
        self.run_dir = f"{self.tmp}/run"
        os.makedirs(self.run_dir, mode=0o700)

    def config(self, ports=None):
        """The client config; `ports`: alias -> the port it reaches (a relay's)."""
        tmp, user = self.tmp, subprocess.run(["id", "-un"], capture_output=True,
                                             text=True).stdout.strip()
        with open(f"{tmp}/ssh_config", "w") as f:
            for a in ALIASES:
                port = (ports or {}).get(a, self.port)
                f.write(loopback_sshd.host(
                    a, port, user, tmp, "gpuloop-bench",
                    f"GPULOOP_SIM=8x80G GPULOOP_SIM_DIR={tmp}/sims/{a} "
                    f"XDG_CACHE_HOME={tmp}/cache/{a} BASH_ENV={tmp}/env.sh"))
        return f"{tmp}/ssh_config"

    def setup(self):
        tmp = self.tmp
        loopback_sshd.write(tmp, "gpuloop-bench", accept=("XDG_CACHE_HOME", "BASH_ENV"))
        with open(f"{tmp}/sshd_config", "a") as f:
            f.write("Subsystem sftp internal-sftp\n")  # scp's own protocol (the baseline)
        # The hosts' login shell (bash) reads this first: a PATH without any gpuloop.
        with open(f"{tmp}/env.sh", "w") as f:
            f.write("export PATH=/usr/bin:/bin\n")
        self.cfg = self.config()
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        self.sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", f"{tmp}/sshd_config",
                                      "-p", str(self.port), "-E", f"{tmp}/sshd.log"])
        end = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > end or self.sshd.poll() is not None:
                    raise SystemExit("sshd did not start: " + open(f"{tmp}/sshd.log").read())
                time.sleep(0.05)
        r = subprocess.run(["ssh", "-F", self.cfg, "-o", "BatchMode=yes", "h01",
                            "command -v gpuloop || echo none"], capture_output=True, text=True)
        if r.stdout.strip() != "none":
            raise SystemExit(f"the hosts must lack gpuloop; h01 said {r.stdout!r} {r.stderr!r}")

    def env(self):
        e = dict(os.environ, XDG_RUNTIME_DIR=self.run_dir, NO_COLOR="1")
        for v in ("GPULOOP_SIM", "GPULOOP_SIM_DIR"):
            e.pop(v, None)
        return e

    def oneshot(self, *extra):
        t = time.monotonic()
        r = subprocess.run([BIN, "--ssh-config", self.cfg, *extra, "--host", EXPR, "gpus",
                            "--json"], capture_output=True, text=True, env=self.env())
        dt = time.monotonic() - t
        if r.returncode != 0:
            raise SystemExit(f"gpuloop exited {r.returncode}: {r.stderr[-2000:]}")
        gpus = json.loads(r.stdout)
        if len(gpus) != 8 * HOSTS:
            raise SystemExit(f"expected {8 * HOSTS} GPUs, got {len(gpus)}")
        return dt

    def end_kept(self):
        """Ends the connections gpuloop kept (ssh -O exit on each socket)."""
        d = f"{self.run_dir}/gpuloop"
        for s in os.listdir(d) if os.path.isdir(d) else []:
            subprocess.run(["ssh", "-F", self.cfg, "-o", f"ControlPath={d}/{s}", "-O", "exit",
                            "h01"], capture_output=True)

    def cold(self):
        self.end_kept()
        shutil.rmtree(f"{self.tmp}/cache", ignore_errors=True)
        return self.oneshot()

    def ids(self):
        return [f for a in ALIASES for f in os.listdir(f"{self.tmp}/cache/{a}/gpuloop")
                if f.endswith(".id")]

    def drop_ids(self):
        for a in ALIASES:
            d = f"{self.tmp}/cache/{a}/gpuloop"
            for f in os.listdir(d):
                if f.endswith(".id"):
                    os.unlink(f"{d}/{f}")

    def baseline_dest(self, a):
        return f"{self.tmp}/cache/{a}/gpuloop-copied"

    def baseline_ssh(self):
        """`ssh HOST BIN gpus --json` on every host at once: pdsh where installed, else one
        ssh per host started together."""
        dest, pdsh = self.baseline_dest, shutil.which("pdsh")
        if pdsh:
            r = subprocess.run([pdsh, "-R", "ssh", "-f", "32", "-w", EXPR,
                                f"{self.tmp}/cache/%h/gpuloop-copied gpus --json"],
                               capture_output=True, text=True,
                               env=dict(os.environ, PDSH_SSH_ARGS_APPEND=f"-F {self.cfg}"))
            ok = r.returncode == 0
        else:
            ps = [subprocess.Popen(["ssh", "-F", self.cfg, "-o", "BatchMode=yes", a,
                                    f"{dest(a)} gpus --json"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE) for a in ALIASES]
            ok = all(p.communicate() and p.returncode == 0 for p in ps)
        if not ok:
            raise SystemExit("the ssh baseline failed")

    def baseline_first(self):
        """scp of the binary to every host (all at once), then the ssh on each: the time."""
        for a in ALIASES:
            os.makedirs(f"{self.tmp}/cache/{a}", exist_ok=True)
            if os.path.exists(self.baseline_dest(a)):
                os.unlink(self.baseline_dest(a))
        t = time.monotonic()
        ps = [subprocess.Popen(["scp", "-q", "-F", self.cfg, "-o", "BatchMode=yes", BIN,
                                f"{a}:{self.baseline_dest(a)}"]) for a in ALIASES]
        if any(p.wait() != 0 for p in ps):
            raise SystemExit("scp failed")
        self.baseline_ssh()
        return time.monotonic() - t

    def baseline_repeat(self):
        """The ssh alone, the copies there: the time."""
        t = time.monotonic()
        self.baseline_ssh()
        return time.monotonic() - t

    def bytes_per_host(self):
        relays = {a: Relay(self.port) for a in ALIASES}
        self.end_kept()
        shutil.rmtree(f"{self.tmp}/cache", ignore_errors=True)
        self.cfg = self.config({a: r.port for a, r in relays.items()})
        self.oneshot()
        self.end_kept()
        time.sleep(0.5)  # the relays' last reads
        sent = sorted(r.sent for r in relays.values())
        self.cfg = self.config()
        for r in relays.values():
            r.srv.close()
        return {"median": sent[len(sent) // 2], "max": sent[-1], "min": sent[0]}

    def close(self):
        try:
            self.end_kept()
        finally:
            if self.sshd and self.sshd.poll() is None:
                self.sshd.terminate()  # our own child, by pid
                self.sshd.wait()
            shutil.rmtree(self.tmp, ignore_errors=True)


def med(xs):
    return round(statistics.median(xs), 3)


def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": os.uname().release, "openssh": ssh,
            "load_before": os.getloadavg()[0]}


def main():
    b = Bench()
    try:
        b.setup()
        out = {"hosts": HOSTS, "binary_bytes": os.path.getsize(BIN),
               "gzip1_bytes": len(subprocess.run(["gzip", "-1", "-c", BIN],
                                                 capture_output=True).stdout),
               "machine": machine()}
        # gpuloop's runs and what a user would run instead take turns, one trial of each
        # per round, so load that comes and goes on a shared machine falls on both.
        firsts, base_firsts = [], []
        for _ in range(COLD):
            firsts.append(b.cold())
            base_firsts.append(b.baseline_first())
        # After the last first run: its copies and kept connections serve the repeats.
        repeats, fresh, hashed, base_repeats = [], [], [], []
        for _ in range(REPS):
            stored = b.ids()
            if len(stored) != HOSTS:
                raise SystemExit(f"expected a .id sidecar per host, found {stored}")
            repeats.append(b.oneshot())
            base_repeats.append(b.baseline_repeat())
            fresh.append(b.oneshot("--no-reuse"))
            # Last in the round: the run that hashes every copy again writes its .id anew.
            b.drop_ids()
            hashed.append(b.oneshot("--no-reuse"))
        out["gpuloop"] = {
            "first_s": med(firsts), "first_all_s": [round(x, 3) for x in firsts],
            "repeat_s": med(repeats), "repeat_over_first": round(med(repeats) / med(firsts), 3),
            "repeat_no_reuse_s": med(fresh),
            "repeat_no_reuse_hashing_every_time_s": med(hashed),
        }
        out["bytes_sent_per_host_first_run"] = b.bytes_per_host()
        out["baseline"] = {
            "tool": "pdsh -R ssh" if shutil.which("pdsh") else "ssh per host, all at once",
            "first_s": med(base_firsts), "repeat_s": med(base_repeats),
            "repeat_over_first": round(med(base_repeats) / med(base_firsts), 3)}
        text = json.dumps(out, indent=1)
        if OUT:
            with open(OUT, "w") as f:
                f.write(text + "\n")
        print(text)
    finally:
        b.close()


if __name__ == "__main__":
    main()
