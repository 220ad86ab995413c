#!/usr/bin/env bash
# The holder scan with and without containers (issue 35): the same N simulated holders (50 by
# default), once as plain processes and once each in a podman container of its own (runc, the
# cgroupfs manager) under a kubelet-shaped cgroup parent with the CRI's annotations, so that
# every holder's container and pod are read from podman's state on disk and the kubelet's
# directory (half the pods deleted). Runs A (plain), B (containers), A again, to bracket drift.
# Needs root, podman, runc, busybox-static; installs hyperfine with apt-get if missing.
# Writes benches/results/containers-*.json and prints gpuloop's own -v breakdown.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-50} RUNS=${RUNS:-40}
command -v hyperfine >/dev/null || { apt-get update -qq && apt-get install -y -qq hyperfine >/dev/null; }
cargo build --release -q
BIN=$PWD/target/release/gpuloop
DIR=$(mktemp -d /tmp/gpuloop-bench-XXXXXX)
export GPULOOP_SIM=1x80G GPULOOP_SIM_DIR=$DIR/state XDG_CONFIG_HOME=$DIR/config XDG_STATE_HOME=$DIR/state-home
mkdir -p "$DIR/config/gpuloop" "$DIR/kubelet/pods" "$DIR/logs"
printf '[containers]\nkubelet = "%s"\npod_logs = "%s"\n' "$DIR/kubelet" "$DIR/logs" >"$DIR/config/gpuloop/config.toml"
# The simulated driver is the host's: it lists a container's holder by its host pid.
$BIN gpus >/dev/null
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
plain=() ctrs=() uids=()
cleanup() {
  for p in "${plain[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for c in "${ctrs[@]}"; do "${PODMAN[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  for u in "${uids[@]}"; do
    for m in /sys/fs/cgroup/*/kubepods/burstable /sys/fs/cgroup/kubepods/burstable; do
      rmdir "$m/pod$u" 2>/dev/null || true
    done
  done
  "${PODMAN[@]}" rmi -f "$IMAGE" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
IMAGE=localhost/gpuloop-bench:latest
trap cleanup EXIT

# The image: busybox-static and the libraries gpuloop links (gpuloop is mounted in).
root=$DIR/root
mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc}
cp /bin/busybox "$root/bin/"
ln -s busybox "$root/bin/sh"
for lib in $(ldd "$BIN" | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
tar -C "$root" -cf "$DIR/root.tar" .
"${PODMAN[@]}" import "$DIR/root.tar" "$IMAGE" >/dev/null

held() { $BIN --json holders | grep -c '"role": "compute"' || true; }
wait_for() { until [ "$(held)" -ge "$1" ]; do sleep 0.2; done; }
mkdir -p benches/results
measure() {
  hyperfine -N --warmup 3 --runs "$RUNS" -n "$1" "$BIN holders" --export-json "benches/results/containers-$2.json"
  $BIN -v holders 2>&1 >/dev/null | grep -E 'inventory:|lineage of' || true
}
start_plain() {
  for _ in $(seq "$N"); do plain+=("$($BIN sim hold --gpu 0 --mib 10)"); done
  wait_for "$N"
}
stop_plain() {
  for p in "${plain[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  plain=()
  until [ "$(held)" -eq 0 ]; do sleep 0.2; done
}

echo "== A: $N plain holders"
start_plain
measure "holders, $N plain holders" plain-1
stop_plain

echo "== B: $N holders, each in a container of a pod"
for i in $(seq "$N"); do
  uid=$(printf 'b%07x-%04x-4000-8000-%012x' "$i" "$$" "$(date +%s%N | cut -c1-12)")
  uids+=("$uid")
  # Half the pods are known to the kubelet, half deleted.
  [ $((i % 2)) -eq 0 ] && mkdir -p "$DIR/kubelet/pods/$uid"
  ctrs+=("$("${PODMAN[@]}" run -d --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
    --cgroup-parent "/kubepods/burstable/pod$uid" \
    --annotation io.kubernetes.pod.name="job-$i" --annotation io.kubernetes.pod.namespace=bench \
    --annotation io.kubernetes.pod.uid="$uid" --annotation io.kubernetes.container.name=worker \
    -v "$BIN:/gpuloop:ro" -v "$DIR:$DIR" -e GPULOOP_SIM_DIR="$GPULOOP_SIM_DIR" -e GPULOOP_SIM="$GPULOOP_SIM" \
    "$IMAGE" /gpuloop sim hold --gpu 0 --mib 10 --foreground)")
done
wait_for "$N"
measure "holders, $N holders in containers" containers
for c in "${ctrs[@]}"; do "${PODMAN[@]}" rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
ctrs=()
until [ "$(held)" -eq 0 ]; do sleep 0.2; done

echo "== A again: $N plain holders"
start_plain
measure "holders, $N plain holders (again)" plain-2
stop_plain
