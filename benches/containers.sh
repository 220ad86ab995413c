#!/usr/bin/env bash
# The holder scan with and without containers (issue 35). Two simulators on one machine at
# once, so both see the same process table: one with N (50 by default) plain holders, one with
# N holders each in a podman container of its own (runc, the cgroupfs manager) under a
# kubelet-shaped cgroup parent with the CRI's annotations, so that every holder's container
# and pod are read from podman's state on disk and the kubelet's directories (half the pods
# deleted), and the kubelet's links to the containers' logs (`/var/log/containers`), as a
# kubelet makes them for the containers it starts. `gpuloop holders` runs on each in turn, RUNS
# times (alternating, so drift on a shared machine falls on all alike): on the containers' node
# as it runs day to day (the runtimes' state files that an earlier run read, unchanged,
# remembered), and as a first look at these containers finds it ("_first": gpuloop's state
# directory there, as after any earlier run, but nothing remembered, so every state file is
# read, and what was read is written down), and as the first run of gpuloop ever ("_cold": a
# state directory of its own each time, made by the run); "ctr"
# with the kubelet's links (its containers named by one listing), "ctr_bundles" without them
# (containers the kubelet did not start: each one's bundle read). Then with -v for gpuloop's
# own breakdown: the driver's part (the simulated one
# finds a container's host pid by its lock once, then checks the lock line at the fd it
# recorded; a real driver knows it), the scan, the lineage its threads read (parents, cgroups)
# and the time they spent looking up the containers' and pods' state (summed over the
# threads), and what is left of the lineage after the scan.
# Needs root, podman, runc, busybox-static. Writes benches/results/containers.json (OUT=
# another path).
# BIN=path: that gpuloop (else a release build, which cargo makes only if it is out of date).
# The image (busybox and the libraries gpuloop links; gpuloop itself is mounted in) is named by
# a hash of its content, imported only where podman lacks it, and kept: a second run on the
# host, at the same time or later, uses the same image and never removes it from under another.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-50} RUNS=${RUNS:-60}
OUT=${OUT:-benches/results/containers.json}
[ -n "${BIN:-}" ] || { cargo build --release -q; BIN=$PWD/target/release/gpuloop; }
BIN=$(realpath "$BIN")
DIR=$(mktemp -d /tmp/gpuloop-bench-XXXXXX)
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
export GPULOOP_SIM=1x80G XDG_CONFIG_HOME=$DIR/config XDG_STATE_HOME=$DIR/state-home
mkdir -p "$DIR/config/gpuloop" "$DIR/bundles-config/gpuloop" "$DIR/kubelet/pods" "$DIR/logs" \
  "$DIR/container-logs" "$DIR/no-links"
for c in config:container-logs bundles-config:no-links; do
  printf '[containers]\nkubelet = "%s"\npod_logs = "%s"\ncontainer_logs = "%s"\n' \
    "$DIR/kubelet" "$DIR/logs" "$DIR/${c#*:}" >"$DIR/${c%%:*}/gpuloop/config.toml"
done
plain=() ctrs=() uids=()
cleanup() {
  for p in "${plain[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for c in "${ctrs[@]}"; do "${PODMAN[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  for u in "${uids[@]}"; do
    for m in /sys/fs/cgroup/*/kubepods/burstable /sys/fs/cgroup/kubepods/burstable; do
      # podman's cgroupfs manager puts conmon in the pod's cgroup, below the container's.
      for d in "$m/pod$u"/*/; do rmdir "$d" 2>/dev/null || true; done
      rmdir "$m/pod$u" 2>/dev/null || true
    done
  done
  rm -rf "$DIR"
}
trap cleanup EXIT
# Each simulated driver is the host's: it lists a container's holder by its host pid.
GPULOOP_SIM_DIR=$DIR/plain $BIN gpus >/dev/null
GPULOOP_SIM_DIR=$DIR/ctr $BIN gpus >/dev/null

# The image: busybox-static and the libraries gpuloop links (gpuloop is mounted in), tagged
# with the hash of those files' names and bytes.
libs=$(ldd "$BIN" | grep -o '/[^ ]*')
hash=$(for f in /bin/busybox $libs; do echo "$f"; cat "$f"; done | sha256sum | cut -c1-16)
IMAGE=localhost/gpuloop-bench:$hash
if ! "${PODMAN[@]}" image exists "$IMAGE"; then
  root=$DIR/root
  mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc}
  cp /bin/busybox "$root/bin/"
  for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
  tar -C "$root" -cf "$DIR/root.tar" .
  # Two runs importing the same content at once tag the same image: either import will do.
  "${PODMAN[@]}" import "$DIR/root.tar" "$IMAGE" >/dev/null
fi
echo "image $IMAGE"

held() { GPULOOP_SIM_DIR=$1 $BIN --json holders | grep -c '"role": "compute"' || true; }
for _ in $(seq "$N"); do plain+=("$(GPULOOP_SIM_DIR=$DIR/plain $BIN sim hold --gpu 0 --mib 10)"); done
for i in $(seq "$N"); do
  uid=$(printf 'b%07x-%04x-4000-8000-%012x' "$i" "$(($$ & 0xffff))" "$i")
  uids+=("$uid")
  # Half the pods are known to the kubelet, half deleted.
  [ $((i % 2)) -eq 0 ] && mkdir -p "$DIR/kubelet/pods/$uid"
  ctrs+=("$("${PODMAN[@]}" run -d --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    --cgroup-parent "/kubepods/burstable/pod$uid" \
    --annotation io.kubernetes.pod.name="job-$i" --annotation io.kubernetes.pod.namespace=bench \
    --annotation io.kubernetes.pod.uid="$uid" --annotation io.kubernetes.container.name=worker \
    -v "$BIN:/gpuloop:ro" -v "$DIR:$DIR" -e GPULOOP_SIM_DIR="$DIR/ctr" -e GPULOOP_SIM="$GPULOOP_SIM" \
    "$IMAGE" /gpuloop sim hold --gpu 0 --mib 10 --foreground)")
  # What the kubelet leaves for the container it started: its pod's log directory, and a link
  # to the log named for the pod, the namespace, the container and its id.
  mkdir -p "$DIR/logs/bench_job-${i}_$uid/worker"
  ln -s "$DIR/logs/bench_job-${i}_$uid/worker/0.log" "$DIR/container-logs/job-${i}_bench_worker-${ctrs[-1]}.log"
done
until [ "$(held "$DIR/ctr")" -ge "$N" ] && [ "$(held "$DIR/plain")" -ge "$N" ]; do sleep 0.2; done
echo "processes: $(ls /proc | grep -c '^[0-9]'); $N plain holders, $N holders in containers"
mkdir -p "$(dirname "$OUT")"
python3 - "$BIN" "$DIR" "$N" "$RUNS" "$OUT" <<'EOF'
import json, os, re, statistics, subprocess, sys, time
bin_, d, n, runs, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sim = lambda k: dict(os.environ, GPULOOP_SIM_DIR=f"{d}/{k}")
bundles = lambda env: dict(env, XDG_CONFIG_HOME=f"{d}/bundles-config",
                           XDG_STATE_HOME=f"{d}/bundles-state-home")
envs = {"plain": sim("plain"), "ctr": sim("ctr"), "ctr_bundles": bundles(sim("ctr"))}
def first(k):
    """A first look at the containers: the state directory there, nothing remembered in it."""
    def env(i):
        home = f"{d}/first/{k}"
        os.makedirs(f"{home}/gpuloop", mode=0o700, exist_ok=True)
        try:
            os.unlink(f"{home}/gpuloop/runtime-state.json")
        except FileNotFoundError:
            pass
        return dict(envs[k], XDG_STATE_HOME=home)
    return env
# A first run ever: a state directory of its own each time, that the run makes.
cold = {"ctr_first": first("ctr"), "ctr_bundles_first": first("ctr_bundles"),
        "ctr_cold": lambda i: dict(envs["ctr"], XDG_STATE_HOME=f"{d}/cold/{i}"),
        "ctr_bundles_cold": lambda i: dict(envs["ctr_bundles"], XDG_STATE_HOME=f"{d}/bcold/{i}")}
# Wall time, and CPU time (user + system): on a shared machine the CPU a run costs moves
# less than its wall time.
wall = {k: [] for k in [*envs, *cold]}
cpu = {k: [] for k in wall}
for i in range(runs):
    for k, env in [*envs.items(), *((k, f(i)) for k, f in cold.items())]:
        t = time.perf_counter()
        p = subprocess.Popen([bin_, "holders"], env=env, stdout=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        assert status == 0, status
        wall[k].append((time.perf_counter() - t) * 1e3)
        cpu[k].append((ru.ru_utime + ru.ru_stime) * 1e3)
parts = {k: {p: [] for p in ("driver", "driver_cpu", "scan", "scan_cpu", "lineage_read",
                              "lineage", "state")} for k in envs}
how = {}
for _ in range(runs // 2):
    for k, env in envs.items():
        err = subprocess.run([bin_, "-v", "holders"], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, check=True).stderr
        m = re.search(r"from sim in ([\d.]+) ms \(([\d.]+) ms of CPU\), beside a scan of \d+ "
                      r"processes in ([\d.]+) ms \(([\d.]+) ms of CPU\).*lineage read in ([\d.]+) ms", err)
        for i, p in enumerate(("driver", "driver_cpu", "scan", "scan_cpu", "lineage_read")):
            parts[k][p].append(float(m.group(i + 1)))
        m = re.search(r"lineage of \d+ holder\(s\) in ([\d.]+) ms; .* looked up in ([\d.]+) ms "
                      r"\((\d+) named by the kubelet's log links, (\d+) state file", err)
        parts[k]["lineage"].append(float(m.group(1)))
        parts[k]["state"].append(float(m.group(2)))
        how[k] = {"named_by_kubelet_links": int(m.group(3)), "state_files_read": int(m.group(4))}
med = lambda xs: round(statistics.median(xs), 2)
out = {k: {"wall_ms_median": med(wall[k]), "wall_ms_min": round(min(wall[k]), 2),
           "cpu_ms_median": med(cpu[k]), "cpu_ms_min": round(min(cpu[k]), 2),
           **{f"{p}_ms_median": med(v) for p, v in parts.get(k, {}).items()},
           **how.get(k, {})} for k in wall}
for k in wall:
    if k != "plain":
        out[k]["wall_vs_plain"] = round(out[k]["wall_ms_median"] / out["plain"]["wall_ms_median"], 3)
        out[k]["cpu_vs_plain"] = round(out[k]["cpu_ms_median"] / out["plain"]["cpu_ms_median"], 3)
out["holders"] = n
out["runs"] = runs
out["load_average"] = os.getloadavg()[0]
print(json.dumps(out, indent=2))
json.dump(out, open(out_path, "w"), indent=2)
EOF
