"""Builds a process table for benchmarks: N `sleep` processes with K open fds each.

    python3 benches/proctable.py N K PIDFILE

Writes the pids to PIDFILE once all are running, then waits; SIGTERM (or stdin closing) kills
exactly those processes and exits. Only processes it started are ever signalled.
"""
import os, signal, sys, time

n, k, pidfile = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
fds = []
for i in range(k):
    fd = os.open("/dev/null" if i % 2 else "/etc/hostname", os.O_RDONLY)
    os.set_inheritable(fd, True)
    fds.append(fd)
pids = []


def stop(*_):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    for p in pids:
        try:
            os.waitpid(p, 0)
        except OSError:
            pass
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/sleep", ["sleep", "3600"])
        finally:
            os._exit(127)
    pids.append(pid)
with open(pidfile + ".tmp", "w") as f:
    f.write("\n".join(map(str, pids)))
os.rename(pidfile + ".tmp", pidfile)
while True:
    time.sleep(1)
