"""Runs a command with a FUSE file system mounted that never answers: the kernel's first
request (INIT) is left unread, so every lookup, stat and open under the mount point waits,
as on a hung NFS or FUSE server. Run it as root in a mount namespace of its own
(`unshare --mount --propagation private`), so that nothing else on the machine sees the mount.

    python3 hung_mount.py MOUNTPOINT TERM_AFTER_S COMMAND...

Sends the command SIGTERM after TERM_AFTER_S seconds (0: never), waits at most 30 s more for
it to end, then aborts the connection (whatever still waits gets an error), kills the command
if it still runs, and prints one JSON line: rc, termed, hung (it had not ended), stdout, stderr.
"""
import ctypes
import json
import os
import signal
import subprocess
import sys

mnt, term_after, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
os.makedirs(mnt, exist_ok=True)
fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
libc = ctypes.CDLL(None, use_errno=True)
opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
if libc.mount(b"gpuloop-hung", mnt.encode(), b"fuse", 0, opts) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
out = {"termed": False, "hung": False}
try:
    if term_after > 0:
        try:
            p.wait(term_after)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
            out["termed"] = True
    p.wait(30)
except subprocess.TimeoutExpired:
    out["hung"] = True
# The connection's last descriptor closed: the kernel aborts it, and every request waiting on
# it fails, so a process stuck in one can end.
os.close(fd)
try:
    p.wait(5)
except subprocess.TimeoutExpired:
    p.kill()
o, e = p.communicate()
libc.umount2(mnt.encode(), 2)
out.update(rc=p.returncode, stdout=o.decode(errors="replace"), stderr=e.decode(errors="replace"))
print(json.dumps(out))
