#!/usr/bin/env bash
# Builds the fuzz targets with libFuzzer instrumentation (stable Rust, no cargo-fuzz) and runs
# each for SECONDS (default 30) over its seed corpus. Exits non-zero on any crash; crash
# inputs are left in fuzz/artifacts/<target>/.
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-30}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(sim_spec config patch protocol hostlist)

triple="$(rustc -vV | sed -n "s/^host: //p")"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# --target keeps the flags off build scripts and proc macros (they have no libFuzzer).
cargo build --release --locked --target "$triple" $(printf -- '--bin %s ' "${targets[@]}")

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failed=0
for t in "${targets[@]}"; do
    mkdir -p "artifacts/$t" "$tmp/corpus/$t" "$tmp/tmp"
    echo "== $t: ${secs}s"
    # The grown corpus goes to a temp dir; the committed seeds are only read.
    rc=0
    TMPDIR="$tmp/tmp" "target/$triple/release/$t" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="artifacts/$t/" "$tmp/corpus/$t" "corpus/$t" >"$tmp/$t.log" 2>&1 || rc=$?
    grep -E '^#[0-9]+.*(INITED|DONE)|^stat::(number_of_executed_units|peak_rss)' "$tmp/$t.log" || true
    if [ "$rc" != 0 ] || grep -qE 'ERROR: libFuzzer|panicked at|SUMMARY: libFuzzer' "$tmp/$t.log"; then
        echo "!! $t: crash (exit $rc), input in fuzz/artifacts/$t/" >&2
        tail -n 30 "$tmp/$t.log" >&2
        failed=1
    fi
done
exit $failed
