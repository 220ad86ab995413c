#!/usr/bin/env bash
# What gpuloop weighs: the release binary, the packages packaging/build.sh makes of it (the
# wheel, and the .deb and tarball where built), and what a push sends a host that lacks
# gpuloop (the binary as src/hosts/push.rs compresses it: `xz -0` in liblzma's multi-threaded
# blocks, CRC64; `gzip -1` where the host lacks xz). Sizes in bytes and MiB (2^20 bytes).
#
#   benches/sizes.sh                  # builds what is out of date, then measures
#   STEPS="binary wheel deb tarball" benches/sizes.sh   # packaging/build.sh's steps to run
#   SKIP_BUILD=1 benches/sizes.sh     # measures target/release and target/dist as they are
#
# The build is packaging/build.sh's (cargo build --release --locked, maturin from PyPI into
# target/packaging once); by default its `binary share wheel` steps. Writes
# benches/results/sizes.json (OUT= another path) and prints a table to paste.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benches/results/sizes.json}
if [ -z "${SKIP_BUILD:-}" ]; then
  # shellcheck disable=SC2086
  bash packaging/build.sh ${STEPS:-binary share wheel}
fi
bin=target/release/gpuloop
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ -x "$bin" ] || { echo "sizes.sh: no $bin (run without SKIP_BUILD)" >&2; exit 1; }
# A package built for another version, or before the binary, would not be this binary's.
files=("$bin")
for f in target/dist/gpuloop-"$version"-*.whl target/dist/gpuloop_"$version"_*.deb \
  target/dist/gpuloop-"$version"-*.tar.gz; do
  [ -e "$f" ] || continue
  if [ "$f" -ot "$bin" ]; then
    echo "sizes.sh: $f is older than $bin: left out (build it again)" >&2
    continue
  fi
  files+=("$f")
done
xz_bytes=$(xz -0 -T8 --check=crc64 -c "$bin" | wc -c)
gz_bytes=$(gzip -1 -c "$bin" | wc -c)
python3 - "$OUT" "$(git rev-parse --short HEAD)" "$version" "$xz_bytes" "$gz_bytes" "${files[@]}" <<'EOF'
import json, os, sys
out, commit, version = sys.argv[1:4]
xz_bytes, gz_bytes, files = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]
mib = lambda n: round(n / 2**20, 2)
rows = {os.path.basename(f) if i else "binary (target/release/gpuloop)": os.path.getsize(f)
        for i, f in enumerate(files)}
rows["binary as xz -0 (what a push sends)"] = xz_bytes
rows["binary as gzip -1 (a push to a host without xz)"] = gz_bytes
res = {"commit": commit, "version": version, "bytes": rows,
       "mib": {k: mib(v) for k, v in rows.items()}}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as f:
    json.dump(res, f, indent=1)
    f.write("\n")
print(f"gpuloop {version} at {commit}")
print("| file | bytes | MiB |\n|---|---|---|")
for k, v in rows.items():
    print(f"| {k} | {v:,} | {mib(v)} |")
EOF
