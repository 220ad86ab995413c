"""The MCP `kill` tool given a long target list: how its time grows with the list.

    python3 benches/kill_targets.py [BIN...]        # default: target/release/gpuloop

Each BIN (a gpuloop binary: main's and a change's, say) serves MCP over stdio on a private
simulator (`--sim 1x8G mcp --allow kill`, its own state directory) and is sent one `kill`
call of 10k, 100k and 300k pids, each above the kernel's pid_max: no process has them, so
nothing is ever signalled, and every target is pinned, found gone and reported skipped, the
work a long list costs. Prints one row per binary and list length: the call's wall time and
the server's CPU time (user + system, from /proc: what a loaded machine does not inflate).
A call past `--limit` seconds (default 600) is cut and reported as such.

Measured on the 2-core shared development machine (load average about 12: wall times are
inflated, CPU times are not), debug builds: main at 2182fd1 took 0.24 / 13.09 / 147.03 s of
CPU (0.47 / 57.95 / 1204 s wall) for 10k / 100k / 300k pids; with the linear kill 0.18 /
1.59 / 4.77 s of CPU (1.24 / 14.15 / 34.63 s wall).
"""
import json
import os
import select
import subprocess
import sys
import tempfile
import time

SIZES = [10_000, 100_000, 300_000]
# Above pid_max's ceiling (4194304): never a process's.
FIRST = 5_000_000


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def send(p, msg):
    p.stdin.write(json.dumps(msg) + "\n")
    p.stdin.flush()


def reply(p, want_id, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if not select.select([p.stdout], [], [], max(0, end - time.monotonic()))[0]:
            return None
        line = p.stdout.readline()
        if not line:
            return None
        m = json.loads(line)
        if m.get("id") == want_id:
            return m
    return None


def one(binary, n, limit):
    with tempfile.TemporaryDirectory(prefix="gpuloop-kill-bench-") as tmp:
        env = dict(os.environ, GPULOOP_SIM_DIR=f"{tmp}/sim", XDG_STATE_HOME=f"{tmp}/state",
                   XDG_CONFIG_HOME=f"{tmp}/config", HOME=tmp, NO_COLOR="1")
        env.pop("GPULOOP_SIGNAL_LOG", None)
        p = subprocess.Popen([binary, "--sim", "1x8G", "mcp", "--allow", "kill"], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, bufsize=1)
        try:
            send(p, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "kill-bench", "version": "1"}}})
            reply(p, 1, 30)
            send(p, {"jsonrpc": "2.0", "method": "notifications/initialized"})
            targets = list(range(FIRST, FIRST + n))
            cpu0, t0 = cpu_seconds(p.pid), time.monotonic()
            send(p, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "kill", "arguments": {"targets": targets, "grace": 1}}})
            r = reply(p, 2, limit)
            wall, cpu = time.monotonic() - t0, cpu_seconds(p.pid) - cpu0
            if r is None:
                return {"n": n, "cut_at_s": limit, "cpu_s": round(cpu, 2)}
            skipped = len(r["result"]["structuredContent"]["skipped"])
            assert skipped == n, f"{skipped} of {n} skipped"
            return {"n": n, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}
        finally:
            p.kill()
            p.wait()


def main():
    args = sys.argv[1:]
    limit = 600
    if args[:1] == ["--limit"]:
        limit, args = float(args[1]), args[2:]
    bins = args or ["target/release/gpuloop"]
    for b in bins:
        for n in SIZES:
            row = one(b, n, limit)
            print(json.dumps({"bin": b, **row}), flush=True)


if __name__ == "__main__":
    main()
