#!/bin/sh
# Makes a self-contained OpenSSH (and pdsh) bundle for benches/hosts.py on a machine without
# them (OPENSSH_BUNDLE=DIR there): this machine's ssh, sshd, ssh-keygen, pdsh and its ssh
# module, and every shared library they load EXCEPT glibc's own, which the target supplies
# (it must be at least as new as the GLIBC_ symbol versions the bundle needs, written to
# DIR/MANIFEST and checked by hosts.py). Libraries are found with ldd; a library counts as
# glibc's when dpkg says package libc6 owns it (on a machine without dpkg: by its name).
# Usage: benches/openssh-bundle.sh DIR   (DIR: a git-ignored folder, e.g. .bench-ssh; it is
# replaced). Only ssh, sshd and ssh-keygen are required; pdsh is bundled when installed.
set -eu
[ $# -eq 1 ] || { echo "usage: $0 DIR" >&2; exit 2; }
dir=$1
case $dir in /|.|..|'') echo "$0: refusing to replace '$dir'" >&2; exit 2 ;; esac

ssh=$(command -v ssh) || { echo "$0: no ssh here (apt-get install openssh-client)" >&2; exit 1; }
keygen=$(command -v ssh-keygen) || { echo "$0: no ssh-keygen here" >&2; exit 1; }
sshd=/usr/sbin/sshd
[ -x "$sshd" ] || { echo "$0: no $sshd here (apt-get install openssh-server)" >&2; exit 1; }
# The pdsh in PATH is Debian's wrapper script; the program is pdsh.bin beside it.
pdsh= pdsh_mod=
if [ -x /usr/bin/pdsh.bin ]; then pdsh=/usr/bin/pdsh.bin; fi
for d in /usr/lib/x86_64-linux-gnu/pdsh /usr/lib64/pdsh /usr/lib/pdsh; do
    if [ -f "$d/sshcmd.so" ]; then pdsh_mod=$d/sshcmd.so; break; fi
done
if [ -z "$pdsh" ] || [ -z "$pdsh_mod" ]; then
    echo "$0: pdsh or its ssh module is not installed here: bundling OpenSSH only" >&2
    pdsh= pdsh_mod=
elif ! strings "$pdsh" | grep -qx "$(dirname "$pdsh_mod")"; then
    # As root pdsh ignores PDSH_MODULE_DIR and loads only from its compiled-in directory:
    # hosts.py must know which one that is.
    echo "$0: $pdsh does not name $(dirname "$pdsh_mod") as its module dir: no pdsh" >&2
    pdsh= pdsh_mod=
fi

# glibc's libraries, by soname, for a machine without dpkg (the loader, libc and the libraries
# that glibc 2.34+ merged into libc but still ships as stubs, and the NSS and debug ones).
is_glibc_name() {
    case $1 in
    ld-linux*.so.* | libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | libdl.so.* | \
        librt.so.* | libresolv.so.* | libanl.so.* | libutil.so.* | libnsl.so.1 | \
        libBrokenLocale.so.* | libnss_*.so.* | libthread_db.so.* | libc_malloc_debug.so.* | \
        libmemusage.so | libpcprofile.so | libSegFault.so) return 0 ;;
    esac
    return 1
}
is_glibc() { # $1: soname, $2: resolved path
    owner=
    if command -v dpkg >/dev/null 2>&1; then
        # dpkg knows the real file under the path it installed it at: with merged /usr,
        # readlink -f gives /usr/lib/... where dpkg has /lib/... (and the reverse).
        real=$(readlink -f "$2")
        owner=$(dpkg -S "$real" 2>/dev/null || dpkg -S "$(dirname "$2")/$(basename "$real")" \
            2>/dev/null || dpkg -S "$2" 2>/dev/null || true)
        case $owner in
        libc6:* | libc6,* | "libc6 "*) return 0 ;;
        ?*) return 1 ;;
        esac
    fi
    is_glibc_name "$1"
}

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib"
cp "$ssh" "$dir/bin/ssh"
cp "$sshd" "$dir/bin/sshd"
cp "$keygen" "$dir/bin/ssh-keygen"
objs="$ssh $sshd $keygen"
if [ -n "$pdsh" ]; then
    mkdir -p "$dir/lib/pdsh"
    cp "$pdsh" "$dir/bin/pdsh" # argv[0] "pdsh": pdsh picks its personality from its name
    cp "$pdsh_mod" "$dir/lib/pdsh/sshcmd.so"
    objs="$objs $pdsh $pdsh_mod"
fi

skipped=
for o in $objs; do
    # "soname => /path (0x...)"; the vdso and the loader line have no "=> /".
    ldd "$o" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
    if is_glibc "$soname" "$path"; then
        echo "glibc (left to the target): $soname" >&2
        is_glibc_name "$soname" || echo "$0: note: $soname is glibc's by dpkg but not by name" >&2
    else
        is_glibc_name "$soname" && { echo "$0: $soname looks like glibc's but dpkg disagrees" >&2; }
        cp -L "$path" "$dir/lib/$soname"
        echo "bundled: $soname (${owner%%:*})" >&2
    fi
done

# Every object must resolve from the bundle alone plus glibc: nothing left to this machine.
missing=$(for o in "$dir"/bin/* "$dir"/lib/*.so* ${pdsh:+"$dir/lib/pdsh/sshcmd.so"}; do
    LD_LIBRARY_PATH=$dir/lib ldd "$o" | awk '$2 == "=>" { print $1, $3 }'
done | sort -u | while read -r soname path; do
    if [ "$path" = "not" ]; then echo "$soname (not found)"; continue; fi
    case $path in "$dir"/lib/* | "$(cd "$dir" && pwd)"/lib/*) continue ;; esac
    is_glibc "$soname" "$path" || echo "$soname ($path)"
done)
[ -z "$missing" ] || { echo "$0: not resolved from the bundle: $missing" >&2; exit 1; }

# The newest GLIBC_ symbol version anything in the bundle needs: the target's glibc must be
# at least that (hosts.py checks before it starts anything).
need=$(for o in "$dir"/bin/* "$dir"/lib/*.so* ${pdsh:+"$dir/lib/pdsh/sshcmd.so"}; do
    objdump -T "$o" | grep -o 'GLIBC_[0-9.]*'
done | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n -u | tail -1)
{
    echo "made_on: $(. /etc/os-release && echo "$PRETTY_NAME") $(uname -m)"
    echo "openssh: $("$ssh" -V 2>&1)"
    if [ -n "$pdsh" ]; then
        echo "pdsh: $("$dir/bin/pdsh" -V 2>&1 | head -1)"
        echo "pdsh_module_dir: $(dirname "$pdsh_mod")"
    else
        echo "pdsh: not bundled"
    fi
    echo "glibc_here: $(getconf GNU_LIBC_VERSION)"
    echo "glibc_min: $need"
} >"$dir/MANIFEST"
chmod -R go-w "$dir"
cat "$dir/MANIFEST" >&2
echo "$dir: $(du -sh "$dir" | cut -f1) ($(ls "$dir/lib" | grep -c '\.so') libraries)" >&2
