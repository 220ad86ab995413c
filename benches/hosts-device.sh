#!/bin/sh
# benches/hosts.py over ssh on a throw-away machine without OpenSSH (the GPU bench machine:
# root, no network, no ssh, no pdsh), with the bundle benches/openssh-bundle.sh made elsewhere.
# Run from the repo root, with target/release/gpuloop and the bundle carried:
#   benches/hosts-device.sh OUTDIR
# It lets the bench add sshd's privilege-separation user and pdsh's module dir, and unlock
# root's login for sshd without PAM (this is a throw-away machine), checks that the bundle loads here, and stops the bench at 570 s (the
# JSON keeps every size finished by then: "complete": false). Writes OUTDIR/hosts-ssh.json and
# OUTDIR/hosts-ssh.log. Env REPS, CALLS, SIZES, TRANSPORTS, ONLY_SESSIONS, FLOOR, OPENSSH_BUNDLE
# override the defaults below.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$1
bundle=${OPENSSH_BUNDLE:-.bench-ssh}
mkdir -p "$out"
{
    echo "machine: $(uname -srm), $(getconf GNU_LIBC_VERSION 2>&1), uid $(id -u), $(nproc) CPUs"
    cat "$bundle/MANIFEST"
    # A library the bundle lacks here shows now, not as an sshd that will not start.
    if command -v ldd >/dev/null 2>&1; then
        for o in "$bundle"/bin/*; do
            LD_LIBRARY_PATH=$bundle/lib ldd "$o" 2>&1 | sed -n "s|not found|not found (needed by $o)|p"
        done
    fi
} 2>&1 | tee "$out/hosts-ssh.log"
export BENCH_MAY_ADD_SSHD_USER=1 BENCH_MAY_ADD_PDSH_MODULES=1 BENCH_MAY_UNLOCK_LOGIN=1
export OPENSSH_BUNDLE="$bundle"
export TRANSPORTS="${TRANSPORTS:-ssh,pipe}" REPS="${REPS:-4}" CALLS="${CALLS:-30}"
rc=0
timeout -s TERM 570 python3 benches/hosts.py target/release/gpuloop "$out/hosts-ssh.json" \
    2>>"$out/hosts-ssh.log" || rc=$?
tail -c 6000 "$out/hosts-ssh.log"
exit $rc
