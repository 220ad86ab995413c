#!/usr/bin/env python3
"""Where one gpu() over N hosts spends its time, from gpuloop -v's account of each call.

    python3 benches/hosts_account.py BIN [BIN2 ...]     (env SIZES=1,16,64 CALLS=300)

For each size and binary: one `gpuloop -v --host h[01-N] eval` session over the pipe transport
(an `ssh` on PATH that starts `gpuloop agent` directly with the alias's simulated 8x80G
machine, as benches/hosts.py's TRANSPORTS=pipe does; no OpenSSH needed), CALLS gpu() calls.
Prints the median of the script's own per-call time and, from the -v lines, of: when the
first and the last host's answer reached its task, when all records were ready, collected
and returned (ms since the call's fan-out began), and the client's CPU per call (its
/proc/PID/stat between two marks). Several binaries are run side by side, size by size.
It signals nothing: the sessions end when their scripts do.
"""
import os, re, shutil, statistics, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pipe_transport import write_pipe_ssh  # noqa: E402
SIZES=[int(x) for x in os.environ.get("SIZES","1,16,64").split(",")]
HZ=os.sysconf('SC_CLK_TCK')
CALLS=int(os.environ.get("CALLS","300"))
tmp=tempfile.mkdtemp()
os.makedirs(f"{tmp}/sims")
open(f"{tmp}/ssh_config","w").close()
bindir=write_pipe_ssh(tmp)
pat=re.compile(r"(\d+) hosts answered in ([\d.]+) ms to ([\d.]+) ms \(last: [^)]*\); their records were ready at ([\d.]+) ms, collected at ([\d.]+) ms, returned at ([\d.]+) ms")
env=dict(os.environ, PATH=bindir+":"+os.environ["PATH"])
try:
    for n in SIZES:
        for B in sys.argv[1:]:
            B=os.path.abspath(B)
            h="h01" if n==1 else f"h[01-{n:02d}]"
            script=f'let x = hosts(); print("MARK"); let d=[]; for i in 0..{CALLS} {{ let a=now(); let g = gpu(); d.push(now()-a); }} print("MARK"); d.sort(); print(d[d.len()/2]*1000.0);'
            p=subprocess.Popen([B,"-v","--ssh-config",f"{tmp}/ssh_config","--remote-bin",B,"--host",h,"eval",script],env=env,stdout=subprocess.PIPE,stderr=open(f"{tmp}/err","w"),text=True)
            marks=[]; out=""
            for line in p.stdout:
                if line.strip()=="MARK":
                    st=open(f"/proc/{p.pid}/stat").read(); f=st[st.rindex(")")+2:].split(); marks.append((int(f[11])+int(f[12]))/HZ)
                else: out+=line
            p.wait()
            class R: pass
            r=R(); r.stdout=out; r.returncode=p.returncode; r.stderr=open(f"{tmp}/err").read()
            cpu=(marks[1]-marks[0])*1e3/CALLS if len(marks)==2 else None
            rows=[tuple(map(float,m.groups()[1:])) for m in map(pat.search, r.stderr.splitlines()) if m]
            med=lambda k: round(statistics.median(x[k] for x in rows),3) if rows else None
            print(f"{n:3d} hosts {os.path.basename(B):16s} script median {r.stdout.strip()[:6]} ms | first answer {med(0)} last {med(1)} ready {med(2)} collected {med(3)} returned {med(4)} (n={len(rows)}) client cpu {cpu:.2f} ms/call rc={r.returncode}", flush=True)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
