#!/usr/bin/env bash
# Runs CI (`.ci/run`) as a fresh machine sees it, to measure the times that count against CI's
# limit: a fresh clone of the committed HEAD, an empty XDG_CACHE_HOME (pip's cache, the SYCL
# kernel cache), an empty CARGO_HOME (crate downloads, cargo-fuzz) and the
# clone's own target directory. What stays warm is what the machine image or an earlier `apt-get`
# put there: the system packages, the rustup toolchains (`rustup toolchain install` writes to
# the real RUSTUP_HOME) and the Gemma model that its PyPI package assembles under ~/.cache.
#
#   scripts/ci-cold.sh [--keep]          # in a new folder under /tmp
#   scripts/ci-cold.sh [--keep] DIR      # in DIR (must not exist yet)
#
# Prints .ci/run's output, then its table of stage times; the whole log is DIR/ci.log. A run
# leaves about 9 GiB behind (the clone with its target folder and venv, the caches); afterwards
# only ci.log stays, unless --keep. Left behind, a few runs fill the disk, and a machine image
# taken from that disk hands the next CI run a full one.
# The whole script is one function, read before it runs: editing the file during a run (which
# takes half an hour) cannot change what the run does.
main() {
  set -euo pipefail
  repo="$(cd "$(dirname "$0")/.." && pwd)"
  keep=0
  if [ "${1:-}" = "--keep" ]; then
    keep=1
    shift
  fi
  work="${1:-$(mktemp -d /tmp/tessera-ci-cold.XXXXXX)}"
  if [ -n "${1:-}" ]; then
    if [ -e "$work" ]; then
      echo "ci-cold: $work exists; give a new folder" >&2
      exit 2
    fi
    mkdir -p "$work"
  fi
  work="$(cd "$work" && pwd)"
  if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
    echo "ci-cold: uncommitted changes in $repo are not part of the run (it clones HEAD)" >&2
  fi
  # PATH without folder $1.
  without() {
    local out="" dir
    local IFS=:
    for dir in $2; do
      [ "$dir" = "$1" ] || out="${out:+$out:}$dir"
    done
    echo "$out"
  }
  git clone -q "$repo" "$work/tessera"
  mkdir -p "$work/cache" "$work/cargo-home"
  # cargo and rustup as the image has them (links to the rustup proxies only, so that tools
  # installed into the real CARGO_HOME, such as cargo-fuzz, are not found), with an empty
  # CARGO_HOME for everything they fetch or install.
  realbin="$(dirname "$(command -v cargo || echo "$HOME/.cargo/bin/cargo")")"
  toolbin="$work/toolchain-bin"
  mkdir -p "$toolbin"
  for tool in cargo rustc rustup rustdoc rustfmt cargo-fmt cargo-clippy clippy-driver; do
    if [ -e "$realbin/$tool" ]; then
      ln -s "$realbin/$tool" "$toolbin/$tool"
    fi
  done
  if [ -f "$realbin/../config.toml" ]; then
    cp "$realbin/../config.toml" "$work/cargo-home/"
  fi
  echo "ci-cold: $(git -C "$work/tessera" log -1 --format='%h %s') in $work"
  cd "$work/tessera"
  status=0
  env XDG_CACHE_HOME="$work/cache" CARGO_HOME="$work/cargo-home" \
    RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" PATH="$toolbin:$(without "$realbin" "$PATH")" CI=true \
    bash .ci/run 2>&1 | tee "$work/ci.log" || status=$?
  cd "$work"
  if [ "$keep" = 0 ]; then
    rm -rf "$work/tessera" "$work/cache" "$work/cargo-home" "$work/toolchain-bin" ||
      echo "ci-cold: could not remove all of $work; delete it by hand" >&2
  fi
  echo "ci-cold: exit $status; log in $work/ci.log"
  exit "$status"
}
main "$@"
exit
