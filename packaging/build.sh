#!/usr/bin/env bash
# Builds what a release ships, into target/dist: the Python wheel that carries the binary
# (maturin, bindings "bin": `pip install gpuloop`), the Debian package (cargo-deb) and a
# tarball, each with the man pages and the bash, zsh and fish completions. One
# `cargo build --release` makes the binary (stripped by the release profile); maturin and
# cargo-deb take it from target/release, so every package carries that one binary.
#
#   packaging/build.sh                    # all of it
#   packaging/build.sh binary wheel       # some steps: binary share wheel deb tarball
#
# The tools come from their registries into target/packaging, once: maturin (PyPI) in a
# venv, cargo-deb (crates.io) through `cargo install`. packaging/check.sh tests what this
# builds; .github/workflows/release.yml runs the steps for each tag.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=$PWD/target/dist
tools=target/packaging
share=$tools/share
bin=target/release/gpuloop
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
say() { printf '[packaging] %s\n' "$*" >&2; }
mkdir -p "$dist" "$tools"

binary() {
  say "cargo build --release"
  cargo build --release --locked
}

# What man and the shells read, laid out as under /usr/share: the .deb installs it there,
# the tarball carries it as it is.
share() {
  say "man pages and completions into $share"
  rm -rf "$share"
  "$bin" man --dir "$share/man/man1" >/dev/null
  gzip -9n "$share"/man/man1/*.1
  mkdir -p "$share/bash-completion/completions" "$share/zsh/vendor-completions" \
    "$share/fish/vendor_completions.d"
  "$bin" completions bash >"$share/bash-completion/completions/gpuloop"
  "$bin" completions zsh >"$share/zsh/vendor-completions/_gpuloop"
  "$bin" completions fish >"$share/fish/vendor_completions.d/gpuloop.fish"
}

# maturin runs cargo on the release profile too, which finds target/release up to date.
wheel() {
  if ! "$tools/tools/bin/maturin" --version >/dev/null 2>&1; then
    say "maturin into $tools/tools (PyPI)"
    python3 -m venv "$tools/tools"
    "$tools/tools/bin/pip" install -q --disable-pip-version-check 'maturin>=1.5,<2'
  fi
  say "wheel (maturin build --release)"
  rm -f "$dist"/gpuloop-*.whl
  "$tools/tools/bin/maturin" build --release --locked --quiet --out "$dist"
}

# --no-strip: the release profile strips already, and the .deb carries the wheel's binary.
# Depends ($auto) comes from dpkg-shlibdeps: the glibc the binary's symbols need.
deb() {
  if ! "$tools/cargo-deb/bin/cargo-deb" --version >/dev/null 2>&1; then
    say "cargo-deb into $tools/cargo-deb (crates.io)"
    cargo install -q --locked --root "$tools/cargo-deb" --version "^3" cargo-deb
  fi
  say "Debian package (cargo deb --no-build)"
  rm -f "$dist"/gpuloop_*.deb
  PATH="$PWD/$tools/cargo-deb/bin:$PATH" cargo deb --no-build --no-strip --quiet --output "$dist" >/dev/null
}

# A prefix: `tar -xzf … -C ~/.local --strip-components=1` puts gpuloop in ~/.local/bin, and
# its man pages and bash completion where man and bash-completion look for a user's.
tarball() {
  local name
  name=gpuloop-$version-$(rustc -vV | sed -n 's/^host: //p')
  say "tarball $name.tar.gz"
  rm -rf "${tools:?}/$name" "$dist"/gpuloop-*.tar.gz
  mkdir -p "$tools/$name/bin" "$tools/$name/share/doc/gpuloop"
  cp "$bin" "$tools/$name/bin/"
  cp -r "$share"/. "$tools/$name/share/"
  cp README.md "$tools/$name/share/doc/gpuloop/"
  tar -C "$tools" -czf "$dist/$name.tar.gz" --owner=0 --group=0 "$name"
  rm -rf "${tools:?}/$name"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(binary share wheel deb tarball)
for s in "${steps[@]}"; do
  case $s in
  binary | share | wheel | deb | tarball) "$s" ;;
  *)
    echo "packaging/build.sh: unknown step '$s' (binary share wheel deb tarball)" >&2
    exit 2
    ;;
  esac
done
ls -l "$dist" >&2
