#!/usr/bin/env bash
# Runs CI (`.ci/run`) as a fresh machine sees it, to measure the times that count against CI's
# limit: a fresh clone of the committed HEAD, an empty XDG_CACHE_HOME (pip's cache, the SYCL
# kernel cache, the models' caches), an empty CARGO_HOME (crate downloads, cargo-fuzz) and the
# clone's own target directory. What stays warm is what the machine image or an earlier `apt-get`
# put there: the system packages and the rustup toolchains.
#
#   scripts/ci-cold.sh             # in a new folder under /tmp, kept afterwards
#   scripts/ci-cold.sh DIR         # in DIR (must not exist yet)
#
# Prints .ci/run's output, then its table of stage times; the whole log is DIR/ci.log.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
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
git clone -q "$repo" "$work/tessera"
mkdir -p "$work/cache" "$work/cargo-home"
# cargo and rustup as the image has them, with an empty CARGO_HOME for everything they fetch.
toolbin="$(dirname "$(command -v cargo || echo "$HOME/.cargo/bin/cargo")")"
echo "ci-cold: $(git -C "$work/tessera" log -1 --format='%h %s') in $work"
cd "$work/tessera"
status=0
env XDG_CACHE_HOME="$work/cache" CARGO_HOME="$work/cargo-home" \
  RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" PATH="$toolbin:$PATH" CI=true \
  bash .ci/run 2>&1 | tee "$work/ci.log" || status=$?
echo "ci-cold: exit $status; log in $work/ci.log"
exit "$status"
