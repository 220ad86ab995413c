#!/usr/bin/env python3
"""The holder scan with and without 50 pods, on a GPU node with its real driver (issue 35).

benches/containers.sh measures with real podman containers and the simulated driver, on the
2-core dev VM (cgroup v1). The GPU machine has no container runtime; this measures there, with
the real driver and cgroup v2, what gpuloop itself does for a holder in a pod: N real CUDA
holders (a context and 64 MiB each, through libcuda) are moved, between runs, from a plain
cgroup into a pod's cgroup each, shaped as the kubelet's systemd driver makes them
(`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/
cri-containerd-<id>.scope`), with containerd's task bundle for each (the CRI's annotations,
11 KiB like a real one), the kubelet's `pods/<uid>` (half the pods deleted), its pod log
directories and its links in `/var/log/containers` (the roots in config.toml point at this
run's copies), and back. The same processes, the same process table: only what gpuloop reads
of their containers and pods differs. `gpuloop holders` runs RUNS times in each state,
alternating: "plain"; "pods" (the kubelet's links name them); "pods_bundles" (no links: every
bundle read, then remembered); "pods_first" and "pods_bundles_first" (nothing remembered).

Run as root on the GPU machine: python3 benches/containers_gpu.py --bin target/release/gpuloop
--out DIR. Writes DIR/containers_gpu.json. Signals only the holders it started.
"""
import argparse, json, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time

HOLD = r"""
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok = (cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
      and cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
      and cu.cuMemAlloc_v2(ctypes.byref(ptr), 64 << 20) == 0)
print("held" if ok else "failed", flush=True)
time.sleep(10**9)
"""

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--out", required=True)
ap.add_argument("--n", type=int, default=50)
ap.add_argument("--runs", type=int, default=100)
a = ap.parse_args()
binary = os.path.abspath(a.bin)
os.makedirs(a.out, exist_ok=True)
d = tempfile.mkdtemp(prefix="gpuloop-ctr-")
cg = "/sys/fs/cgroup"
made_cgroups, holders = [], []
env0 = {k: v for k, v in os.environ.items() if k != "GPULOOP_SIM"}


def cleanup():
    for p in holders:
        try:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        except (ProcessLookupError, ChildProcessError):
            pass
    for c in reversed(made_cgroups):
        try:
            os.rmdir(c)
        except OSError:
            pass
    shutil.rmtree(d, ignore_errors=True)


def move(pid, cgroup):
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(pid))


try:
    # The node's state, as containerd's CRI plugin and the kubelet keep it.
    task = f"{d}/containerd/k8s.io"
    for sub in ("kubelet/pods", "pod-logs", "container-logs", "no-links", "config/gpuloop",
                "bundles-config/gpuloop"):
        os.makedirs(f"{d}/{sub}", exist_ok=True)
    for conf, links in (("config", "container-logs"), ("bundles-config", "no-links")):
        with open(f"{d}/{conf}/gpuloop/config.toml", "w") as f:
            f.write(f'[containers]\ncontainerd = ["{d}/containerd"]\nstorage = []\ndocker = []\n'
                    f'kubelet = "{d}/kubelet"\npod_logs = "{d}/pod-logs"\n'
                    f'container_logs = "{d}/{links}"\n')
    # A cgroup for the plain state, beside the pods'.
    plain_cg = f"{cg}/gpuloop-bench-plain"
    os.makedirs(plain_cg, exist_ok=True)
    made_cgroups.append(plain_cg)
    pods = []
    filler = "x" * 10500  # the rest of an OCI spec (process, mounts, seccomp): 11 KiB in all
    for i in range(a.n):
        uid = f"c{i:07x}-{os.getpid() & 0xffff:04x}-4000-8000-{i:012x}"
        cid = f"{os.getpid():08x}{i:056x}"
        name, ns, ctr = f"job-{i}", "bench", "worker"
        os.makedirs(f"{task}/{cid}", exist_ok=True)
        with open(f"{task}/{cid}/config.json", "w") as f:
            json.dump({"ociVersion": "1.1.0", "process": {"args": ["python3"], "env": [filler]},
                       "annotations": {"io.kubernetes.cri.container-type": "container",
                                       "io.kubernetes.cri.container-name": ctr,
                                       "io.kubernetes.cri.sandbox-name": name,
                                       "io.kubernetes.cri.sandbox-namespace": ns,
                                       "io.kubernetes.cri.sandbox-uid": uid}}, f)
        if i % 2 == 0:
            os.makedirs(f"{d}/kubelet/pods/{uid}")
        os.makedirs(f"{d}/pod-logs/{ns}_{name}_{uid}/{ctr}")
        os.symlink(f"{d}/pod-logs/{ns}_{name}_{uid}/{ctr}/0.log",
                   f"{d}/container-logs/{name}_{ns}_{ctr}-{cid}.log")
        path = cg
        for part in ("kubepods.slice", "kubepods-burstable.slice",
                     f"kubepods-burstable-pod{uid.replace('-', '_')}.slice",
                     f"cri-containerd-{cid}.scope"):
            path = f"{path}/{part}"
            if not os.path.isdir(path):
                os.mkdir(path)
                made_cgroups.append(path)
        pods.append((uid, cid, path))
    # Bundles written more than a second before they are read, as a running container's are.
    time.sleep(1.1)
    for _ in range(a.n):
        holders.append(subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE,
                                        text=True))
    said = [p.stdout.readline().strip() for p in holders]
    assert all(s == "held" for s in said), said
    for p in holders:
        move(p.pid, plain_cg)

    def state(in_pods):
        for p, (_, _, path) in zip(holders, pods):
            move(p.pid, path if in_pods else plain_cg)
        want = "cri-containerd-" if in_pods else "gpuloop-bench-plain"
        for p in holders:
            with open(f"/proc/{p.pid}/cgroup") as f:
                assert want in f.read(), (p.pid, want)

    def env(conf, home):
        return dict(env0, XDG_CONFIG_HOME=f"{d}/{conf}", XDG_STATE_HOME=f"{d}/{home}")

    def first(conf, home):
        os.makedirs(f"{d}/{home}/gpuloop", mode=0o700, exist_ok=True)
        try:
            os.unlink(f"{d}/{home}/gpuloop/runtime-state.json")
        except FileNotFoundError:
            pass
        return env(conf, home)

    variants = {
        "pods": lambda: env("config", "state-links"),
        "pods_bundles": lambda: env("bundles-config", "state-bundles"),
        "pods_first": lambda: first("config", "first-links"),
        "pods_bundles_first": lambda: first("bundles-config", "first-bundles"),
    }
    wall = {k: [] for k in ["plain", *variants]}
    cpu = {k: [] for k in wall}

    def once(k, e):
        t = time.perf_counter()
        p = subprocess.Popen([binary, "holders"], env=e, stdout=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        assert status == 0, status
        wall[k].append((time.perf_counter() - t) * 1e3)
        cpu[k].append((ru.ru_utime + ru.ru_stime) * 1e3)

    # What a look in pods finds: every holder named, half the pods deleted.
    state(True)
    for k, e in variants.items():
        subprocess.run([binary, "holders"], env=e(), stdout=subprocess.DEVNULL, check=True)
    hs = json.loads(subprocess.run([binary, "--json", "holders"], env=variants["pods"](),
                                   capture_output=True, text=True, check=True).stdout)
    mine = {p.pid for p in holders}
    named = [h for h in hs if h["pid"] in mine and (h.get("pod") or {}).get("name")]
    deleted = [h for h in named if h["pod"]["deleted"]]
    verbose = {k: subprocess.run([binary, "-v", "holders"], env=e(), capture_output=True,
                                 text=True).stderr for k, e in variants.items()}
    for i in range(a.runs):
        state(False)
        once("plain", env("config", "state-plain"))
        state(True)
        for k, e in variants.items():
            once(k, e())
    med = lambda xs: round(statistics.median(xs), 2)
    out = {k: {"wall_ms_median": med(wall[k]), "wall_ms_min": round(min(wall[k]), 2),
               "cpu_ms_median": med(cpu[k])} for k in wall}
    for k in variants:
        out[k]["wall_vs_plain"] = round(out[k]["wall_ms_median"] / out["plain"]["wall_ms_median"], 3)
        out[k]["cpu_vs_plain"] = round(out[k]["cpu_ms_median"] / out["plain"]["cpu_ms_median"], 3)
    looked = {k: (m.group(0) if (m := re.search(r"looked up in .*", v)) else v[-300:])
              for k, v in verbose.items()}
    out.update(holders=a.n, runs=a.runs, named=len(named), deleted=len(deleted),
               verbose=looked, processes=sum(1 for p in os.listdir("/proc") if p.isdigit()),
               cores=os.cpu_count(), load_average=os.getloadavg()[0],
               example=next((h for h in hs if h["pid"] in mine), None))
    print(json.dumps(out, indent=2))
    json.dump(out, open(os.path.join(a.out, "containers_gpu.json"), "w"), indent=2)
finally:
    cleanup()
