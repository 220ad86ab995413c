#!/usr/bin/env bash
# The packaging check: builds the wheel, the .deb and the tarball (packaging/build.sh), or
# takes them from the directory given, and tests each as a user meets it:
# - the wheel: installed with pip into a fresh venv, whose `gpuloop` runs the README's first
#   command (the simulator demo); its manylinux tag must be the newest glibc symbol version
#   the binary needs (objdump -T), so pip never installs it where it cannot run;
# - the .deb: unpacked (dpkg-deb -x), its binary runs the demo, man finds its pages,
#   bash-completion's own loader finds its completion, zsh's and fish's are where those
#   shells look, and its Depends asks for the glibc the binary needs;
# - the tarball: unpacked as a prefix (~/.local), where man and bash-completion find its
#   pages and completion.
# All three carry one binary, the one `cargo build --release` made: proof that maturin and
# cargo-deb reused the release build instead of making their own.
# .ci/run runs it after the tests when it is given no arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
if [ $# -gt 0 ]; then
  dist=$(realpath "$1")
else
  bash packaging/build.sh
  dist=$PWD/target/dist
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say() { printf '[packaging] %s\n' "$*" >&2; }
fail() {
  printf 'packaging check FAILED: %s\n' "$*" >&2
  exit 1
}
one() {
  # shellcheck disable=SC2206 # $1 is a glob, meant to expand here
  local found=("$dist"/$1)
  [ ${#found[@]} -eq 1 ] && [ -f "${found[0]}" ] || fail "expected one $1 in $dist, found: ${found[*]}"
  printf '%s\n' "${found[0]}"
}
wheel=$(one 'gpuloop-*.whl')
deb=$(one 'gpuloop_*.deb')
tarball=$(one 'gpuloop-*.tar.gz')

# The README's first command, with a gpuloop from a package: a crashed 8-GPU job on simulated
# GPUs (real processes hold them), cleaned and verified; nothing it started is left behind.
demo() {
  local gl=$1 what=$2 out
  export GPULOOP_SIM_DIR=$work/sim-$what
  out=$("$gl" --sim 8x80G run examples/crashed-job.rhai 2>&1) || demo_failed "$gl" "$what: the demo failed: $out"
  grep -q '^clean: true' <<<"$out" || demo_failed "$gl" "$what: the demo did not end clean: $out"
  [ "$("$gl" --sim 8x80G --json holders --all)" = "[]" ] || demo_failed "$gl" "$what: the demo left holders"
  unset GPULOOP_SIM_DIR
}

# The simulated holders a failed demo left (processes it started, holding this check's own
# simulator files, and nothing else) are stopped before the check fails.
demo_failed() {
  "$1" --sim 8x80G kill --force --grace 0 >/dev/null 2>&1 || true
  fail "$2"
}

# Under SHARE (a /usr/share or a prefix's share/): the man pages, and the completions where
# bash-completion, zsh (Debian's vendor-completions) and fish (vendor_completions.d) look.
share_has_everything() {
  local share=$1 what=$2 page
  for page in gpuloop gpuloop-clean gpuloop-sim-hold; do
    zcat "$share/man/man1/$page.1.gz" 2>/dev/null | grep -q '^\.TH' || fail "$what: no man page $page.1.gz"
  done
  grep -q 'complete .* gpuloop' "$share/bash-completion/completions/gpuloop" ||
    fail "$what: no bash completion"
  grep -q '^#compdef gpuloop' "$share/zsh/vendor-completions/_gpuloop" || fail "$what: no zsh completion"
  grep -q '^complete -c gpuloop' "$share/fish/vendor_completions.d/gpuloop.fish" ||
    fail "$what: no fish completion"
  if command -v zsh >/dev/null; then
    zsh -n "$share/zsh/vendor-completions/_gpuloop" || fail "$what: zsh cannot parse its completion"
  fi
  if command -v fish >/dev/null; then
    fish -n "$share/fish/vendor_completions.d/gpuloop.fish" || fail "$what: fish cannot parse its completion"
  fi
}

# `man -w gpuloop-clean`, run with the environment given, finds the page under MAN.
man_finds() {
  local what=$1 man=$2 found
  shift 2
  if ! command -v man >/dev/null; then
    say "$what: no man command here: its pages are checked by path"
    return
  fi
  found=$(env "$@" man -w gpuloop-clean 2>&1) || fail "$what: man does not find gpuloop-clean: $found"
  [ "$found" = "$man/man1/gpuloop-clean.1.gz" ] || fail "$what: man found $found"
}

# bash-completion's own loader, run with the environment given, registers gpuloop's
# completion; without bash-completion, the file is sourced directly.
bash_loads() {
  local what=$1 file=$2
  shift 2
  if [ -f /usr/share/bash-completion/bash_completion ]; then
    env "$@" bash -c '
      source /usr/share/bash-completion/bash_completion
      if declare -F _comp_load >/dev/null; then _comp_load gpuloop; else __load_completion gpuloop; fi
      complete -p gpuloop' >/dev/null 2>&1 || fail "$what: bash-completion does not load gpuloop's completion"
  else
    say "$what: bash-completion is not installed here: its file is sourced directly"
    bash -c 'source "$1"; complete -p gpuloop' _ "$file" >/dev/null || fail "$what: the bash completion registers nothing"
  fi
}

# --- the wheel ---------------------------------------------------------------------------
say "wheel: $(basename "$wheel")"
python3 -m venv "$work/venv"
t0=$SECONDS
"$work/venv/bin/pip" install -q --disable-pip-version-check --no-index "$wheel"
say "wheel: installed into a fresh venv in $((SECONDS - t0)) s"
gl=$work/venv/bin/gpuloop
[ -x "$gl" ] || fail "the wheel installed no $gl"
"$gl" --version >/dev/null || fail "$gl --version failed"
demo "$gl" wheel

# The tag says the oldest glibc the wheel runs on; the binary's symbols say what it needs.
needed=$(objdump -T "$gl" | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/^GLIBC_//' | sort -uV | tail -n 1)
[ -n "$needed" ] || fail "objdump -T found no GLIBC_ symbol version in $gl"
# Symbol versions may have three parts (2.2.5); tags have two.
needed=$(cut -d. -f1-2 <<<"$needed")
tags=$(basename "$wheel" .whl | cut -d- -f5)
tagged=$(tr '.' '\n' <<<"$tags" | sed -nE \
  -e 's/^manylinux_([0-9]+)_([0-9]+)_.*/\1.\2/p' \
  -e 's/^manylinux2014_.*/2.17/p' -e 's/^manylinux2010_.*/2.12/p' -e 's/^manylinux1_.*/2.5/p' |
  sort -V | head -n 1)
[ -n "$tagged" ] || fail "the wheel's platform tag $tags is no manylinux tag (PyPI refuses it)"
[ "$tagged" = "$needed" ] || fail "the wheel is tagged glibc $tagged ($tags), the binary needs glibc $needed"
say "wheel: tagged $tags: glibc $tagged, the newest glibc symbol version the binary needs (objdump -T)"

# --- the .deb ----------------------------------------------------------------------------
say "deb: $(basename "$deb"): $(dpkg-deb -f "$deb" Package Version Architecture Depends | tr '\n' ' ')"
root=$work/deb
dpkg-deb -x "$deb" "$root"
"$root/usr/bin/gpuloop" --version >/dev/null || fail "the .deb's gpuloop does not run"
demo "$root/usr/bin/gpuloop" deb
share_has_everything "$root/usr/share" deb
man_finds deb "$root/usr/share/man" MANPATH="$root/usr/share/man"
bash_loads deb "$root/usr/share/bash-completion/completions/gpuloop" XDG_DATA_DIRS="$root/usr/share"
# Depends (dpkg-shlibdeps) asks for at least the glibc the binary needs.
depends=$(dpkg-deb -f "$deb" Depends)
libc=$(sed -nE 's/.*libc6 \(>= ([0-9.]+)\).*/\1/p' <<<"$depends")
[ -n "$libc" ] || fail "the .deb depends on no libc6 version: '$depends'"
[ "$(printf '%s\n%s\n' "$needed" "$libc" | sort -V | head -n 1)" = "$needed" ] ||
  fail "the .deb asks for libc6 >= $libc, the binary needs glibc $needed"

# --- the tarball -------------------------------------------------------------------------
say "tarball: $(basename "$tarball")"
prefix=$work/prefix
mkdir "$prefix"
tar -xzf "$tarball" -C "$prefix" --strip-components=1
"$prefix/bin/gpuloop" --version >/dev/null || fail "the tarball's gpuloop does not run"
[ -f "$prefix/share/doc/gpuloop/README.md" ] || fail "the tarball has no share/doc/gpuloop/README.md"
share_has_everything "$prefix/share" tarball
# Unpacked as a prefix (~/.local): man finds the pages from PATH, bash-completion the
# completion in the user's directory.
man_finds tarball "$prefix/share/man" -u MANPATH PATH="$prefix/bin:$PATH"
bash_loads tarball "$prefix/share/bash-completion/completions/gpuloop" \
  BASH_COMPLETION_USER_DIR="$prefix/share/bash-completion"

# --- one binary --------------------------------------------------------------------------
cmp -s "$gl" "$root/usr/bin/gpuloop" || fail "the wheel's and the .deb's binaries differ"
cmp -s "$gl" "$prefix/bin/gpuloop" || fail "the wheel's and the tarball's binaries differ"
if [ $# -eq 0 ]; then
  cmp -s "$gl" target/release/gpuloop || fail "the wheel's binary is not target/release/gpuloop: maturin built its own"
fi

size() { du -k "$1" | cut -f1; }
say "sizes (KiB): binary $(size "$gl"), wheel $(size "$wheel"), deb $(size "$deb"), tarball $(size "$tarball")"
say "ok in $((SECONDS - started)) s"
