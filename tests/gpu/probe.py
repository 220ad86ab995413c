# Probe: what a CUDA holder, a forked child, and an NVML observer look like in /proc on this driver.
import os, sys, time, subprocess, json, signal

def proc_view(pid):
    out = {"pid": pid}
    try:
        fds = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                t = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if "nvidia" in t:
                fds.append(t)
        out["fds"] = sorted(set(fds)); out["nfds_nvidia"] = len(fds)
        maps = set()
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                if "/dev/nvidia" in line:
                    maps.add(line.split()[-1] if len(line.split()) >= 6 else line.strip())
        out["maps"] = sorted(maps)
        with open(f"/proc/{pid}/stat") as f:
            s = f.read(); rest = s[s.rfind(")")+2:].split()
            out["state"], out["ppid"], out["pgid"], out["sid"] = rest[0], rest[1], rest[2], rest[3]
    except Exception as e:
        out["err"] = repr(e)
    return out

def smi():
    return subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()

def smi_mem():
    return subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,memory.used,memory.total,pci.bus_id", "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()

print("ns", os.readlink("/proc/self/ns/pid"))
print(subprocess.run("ls -l /dev/nvidia* /dev/nvidia-caps 2>&1; cat /proc/driver/nvidia/gpus/*/information; ps -eo pid,ppid,comm,args | grep -i -E 'nvidia|dcgm' | grep -v grep; nvidia-smi -q | grep -i -E 'persistence|Minor|Driver Version'", shell=True, capture_output=True, text=True).stdout)
print("mem idle:", smi_mem())

holder_code = r'''
import torch, os, sys, time
x = torch.empty(10**10, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
mode = sys.argv[1]
if mode == "fork":
    pid = os.fork()
    if pid == 0:
        print("child", os.getpid(), flush=True); time.sleep(600); os._exit(0)
    print("ready", flush=True)
    time.sleep(1.0)
    os._exit(0) if len(sys.argv) > 2 else time.sleep(600)
print("ready", flush=True); time.sleep(600)
'''
p = subprocess.Popen([sys.executable, "-c", holder_code, "plain"], stdout=subprocess.PIPE, text=True)
print("plain:", p.stdout.readline().strip())
print("smi:", smi()); print("mem:", smi_mem())
print(json.dumps(proc_view(p.pid)))
try:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print("nvml minor", pynvml.nvmlDeviceGetMinorNumber(h))
    print("nvml compute", [(x.pid, x.usedGpuMemory) for x in pynvml.nvmlDeviceGetComputeRunningProcesses(h)])
    print("nvml graphics", [(x.pid, x.usedGpuMemory) for x in pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)])
    me = proc_view(os.getpid()); print("observer(self after nvmlInit):", json.dumps(me))
except Exception as e:
    print("pynvml err", e)
# unshare view
r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
    "import os,pynvml; pynvml.nvmlInit(); h=pynvml.nvmlDeviceGetHandleByIndex(0); print('ns', os.readlink('/proc/self/ns/pid')); print('in-ns compute', [(x.pid,x.usedGpuMemory) for x in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]); print('in-ns mem', pynvml.nvmlDeviceGetMemoryInfo(h).used)"],
    capture_output=True, text=True)
print("unshare:", r.stdout, r.stderr[-500:])
# kill timing
t0 = time.time(); os.kill(p.pid, signal.SIGKILL); p.wait(); t1 = time.time()
while True:
    used = int(smi_mem().split(",")[2].strip().split()[0])
    if used < 1000: break
print("freed after kill: %.3f s (wait %.3f)" % (time.time() - t0, t1 - t0))
# fork child, creator exits
p = subprocess.Popen([sys.executable, "-c", holder_code, "fork", "exit"], stdout=subprocess.PIPE, text=True)
child = int(p.stdout.readline().split()[1]); p.stdout.readline(); p.wait()
time.sleep(0.3)
print("creator", p.pid, "exited; child", child)
print("smi:", smi()); print("mem:", smi_mem())
print(json.dumps(proc_view(child)))
os.kill(child, signal.SIGKILL)
time.sleep(1)
print("after child kill mem:", smi_mem())
# a python process that imported torch and called torch.cuda.is_available only (no context)
q = subprocess.Popen([sys.executable, "-c", "import torch,time; print(torch.cuda.is_available(), flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
print("is_available-only:", q.stdout.readline().strip(), json.dumps(proc_view(q.pid)))
q.kill()
# nvidia-smi running as observer: strace-less, just check fds of a long nvidia-smi loop
q = subprocess.Popen(["nvidia-smi", "-l", "1"], stdout=subprocess.DEVNULL); time.sleep(1.5)
print("nvidia-smi -l:", json.dumps(proc_view(q.pid))); q.kill()
