#!/usr/bin/env python3
"""N independent one-host sessions at once, each CALLS gpu() calls in a loop: per-call medians.

    python3 benches/hosts_parallel.py BIN N CALLS

Can this machine answer N hosts' calls at once? If N one-host sessions (N clients, N agents
over the pipe transport) each keep their one-host latency, a single session's gpu() over N
hosts that takes much longer is limited by its client, not by the agents or the machine.
The sessions wait 3 s after connecting so that all loops run together. It signals nothing.
"""
import os, statistics, subprocess, sys, tempfile, shutil
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipe_transport import write_pipe_ssh
B = os.path.abspath(sys.argv[1]); N = int(sys.argv[2]); CALLS = int(sys.argv[3])
tmp = tempfile.mkdtemp(); os.makedirs(f"{tmp}/sims"); open(f"{tmp}/ssh_config", "w").close()
env = dict(os.environ, PATH=write_pipe_ssh(tmp) + ":" + os.environ["PATH"])
script = f'let x = hosts(); sleep(3.0); let d=[]; for i in 0..{CALLS} {{ let a=now(); let g = gpu(); d.push(now()-a); }} d.sort(); print(d[d.len()/2]*1000.0);'
ps = [subprocess.Popen([B, "--ssh-config", f"{tmp}/ssh_config", "--remote-bin", B, "--host", f"p{i:02d}", "eval", script], env=env, stdout=subprocess.PIPE, text=True) for i in range(N)]
meds = [float(p.communicate()[0]) for p in ps]
print(f"{N} sessions at once, one host each: per-call median of medians {statistics.median(meds):.3f} ms (min {min(meds):.3f}, max {max(meds):.3f})")
shutil.rmtree(tmp, ignore_errors=True)
