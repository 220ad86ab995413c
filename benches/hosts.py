#!/usr/bin/env python3
"""Several hosts on loopback: gpuloop's long-lived agents against pdsh and an ssh loop.

Starts a private OpenSSH server on 127.0.0.1 (throw-away keys, MaxStartups/MaxSessions raised
for 64 parallel connections), 64 host aliases in a generated client config, each with its own
simulated 8x80G machine and one holder. For 1, 4, 16 and 64 hosts it measures, in one gpuloop
session, the first connection (hosts()) and the per-call latency of gpu() and holders(); then
`gpuloop clean` end to end (connect + kill + verify) with a holder on every host; and the same
query as the one-liner's (`gpuloop gpus --json` standing in for `nvidia-smi --query-gpu`, a new
ssh connection per host per call) through `pdsh -R ssh -f 32` and a sequential ssh loop.
Only processes this script starts are signalled. Usage: benches/hosts.py [BIN] > results.json
"""
import json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, time

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/gpuloop")
CALLS = int(os.environ.get("CALLS", "20"))
REPS = int(os.environ.get("REPS", "5"))
SIZES = [int(x) for x in os.environ.get("SIZES", "1,4,16,64").split(",")]
tmp = tempfile.mkdtemp(prefix="gpuloop-bench-hosts-")
held = []


def sh(*a, **kw):
    return subprocess.run(a, check=True, capture_output=True, text=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hold(alias):
    env = dict(os.environ, GPULOOP_SIM="8x80G", GPULOOP_SIM_DIR=f"{tmp}/sims/{alias}")
    out = sh(BIN, "sim", "hold", "--gpu", "0", "--mib", "1000", env=env).stdout.split()
    held.extend(int(p) for p in out)


def med_ms(xs):
    return round(statistics.median(xs) * 1e3, 2)


def timed(*cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if r.returncode not in (0,):
        raise SystemExit(f"{cmd[:6]} exited {r.returncode}: {r.stderr[-2000:]}")
    return dt, r.stdout


for k in ("host_key", "id"):
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{tmp}/{k}")
shutil.copy(f"{tmp}/id.pub", f"{tmp}/authorized_keys")
with open(f"{tmp}/host_key.pub") as f:
    key = " ".join(f.read().split()[:2])
with open(f"{tmp}/known_hosts", "w") as f:
    f.write(f"gpuloop-bench {key}\n")
port = free_port()
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
""")
user = sh("id", "-un").stdout.strip()
with open(f"{tmp}/ssh_config", "w") as f:
    for i in range(1, max(SIZES) + 1):
        a = f"h{i:02d}"
        f.write(f"""Host {a}
  HostName 127.0.0.1
  Port {port}
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
os.makedirs("/run/sshd", exist_ok=True)
sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", f"{tmp}/sshd_config", "-p", str(port),
                         "-E", f"{tmp}/sshd.log"])
results = {"machine": {
    "cpus": os.cpu_count(),
    "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
    "kernel": os.uname().release,
    "openssh": subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip(),
    "pdsh": subprocess.run(["pdsh", "-V"], capture_output=True, text=True).stdout.splitlines()[0],
}, "calls": CALLS, "reps": REPS, "sizes": {}}
try:
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > deadline:
                raise SystemExit("sshd did not start: " + open(f"{tmp}/sshd.log").read())
            time.sleep(0.05)
    cfg = f"{tmp}/ssh_config"
    gl = [BIN, "--ssh-config", cfg, "--remote-bin", BIN]
    script = f"""
        let t0 = now(); let hs = hosts(); let t1 = now();
        if hs.filter(|h| !h.reachable).len() > 0 {{ throw to_json(hs); }}
        let g = []; for i in 0..{CALLS} {{ let a = now(); let x = gpu(); g.push(now() - a); }}
        let h = []; for i in 0..{CALLS} {{ let a = now(); let x = holders(); h.push(now() - a); }}
        print(to_json(#{{connect: t1 - t0, gpu: g, holders: h, gpus: gpu().len(), holders_n: holders().len()}}));
    """
    for n in SIZES:
        hosts = "h01" if n == 1 else f"h[01-{n:02d}]"
        aliases = [f"h{i:02d}" for i in range(1, n + 1)]
        for a in aliases:
            hold(a)
        r = {"connect_ms": [], "gpu_ms": [], "holders_ms": []}
        for _ in range(REPS):
            _, out = timed(*gl, "--host", hosts, "eval", script)
            m = json.loads(out.strip().splitlines()[-1])
            assert m["gpus"] == 8 * n and m["holders_n"] == n, m
            r["connect_ms"].append(m["connect"])
            r["gpu_ms"].extend(m["gpu"])
            r["holders_ms"].extend(m["holders"])
        clean = []
        for _ in range(REPS):
            for a in aliases:
                hold(a)
            dt, out = timed(*gl, "--host", hosts, "clean", "--grace", "1")
            assert f"{n} host(s): {n} clean" in out or n == 1, out
            clean.append(dt)
        pdsh_env = dict(os.environ, PDSH_RCMD_TYPE="ssh",
                        PDSH_SSH_ARGS=f"-F {cfg} -o BatchMode=yes %h")
        query = f"{BIN} gpus --json >/dev/null"
        pdsh = [timed("pdsh", "-f", "32", "-w", hosts, query, env=pdsh_env)[0] for _ in range(REPS)]
        loop = []
        for _ in range(max(1, REPS if n <= 16 else 2)):
            t = time.perf_counter()
            for a in aliases:
                subprocess.run(["ssh", "-F", cfg, "-o", "BatchMode=yes", a, query], check=True)
            loop.append(time.perf_counter() - t)
        results["sizes"][n] = {
            "first_connection_ms": med_ms(r["connect_ms"]),
            "gpu_call_ms": med_ms(r["gpu_ms"]),
            "holders_call_ms": med_ms(r["holders_ms"]),
            "clean_oneshot_ms": med_ms(clean),
            "pdsh_query_ms": med_ms(pdsh),
            "ssh_loop_query_ms": med_ms(loop),
        }
        print(n, results["sizes"][n], file=sys.stderr)
finally:
    for p in held:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    sshd.terminate()
    sshd.wait()
    shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(results, indent=1))
