#!/usr/bin/env bash
# Builds what scripts/gpu-perf.sh and scripts/gpu-check.sh --prebuilt run, on a machine with the
# toolchain, for a GPU machine that has none (no network, no cargo): the release `tessera` with the
# cuda and vulkan features, the tessera-cuda test binaries (with --full also tessera-vulkan's) and
# the model crate's unit tests with the cuda feature (the llama.cpp reference suite), stripped,
# and the Vulkan loader's Debian packages, packed as DIR/bundle.tar.xz (the scripts unpack it
# into /tmp there). Ends with the carry check: the working tree, the bundle and the peer
# (scripts/gpu-peer.sh DIR) against 56 MiB of the device tool's 64.
#
# Usage: scripts/gpu-bundle.sh [--full] [DIR]   (default .gpu)
# The default bundle is what the prepared call needs (gpu-perf.sh: conformance, the reference
# suite, tessera); --full adds the Vulkan test suites for gpu-check.sh's Vulkan steps.
# --lean is accepted as the default's old name.
# The binaries link glibc and nothing else at build time: libcuda, NVRTC, NCCL and libvulkan are
# opened at run time, so they run on a newer distribution than the one that built them.
set -euo pipefail
cd "$(dirname "$0")/.."
LEAN=1
case "${1:-}" in
  --lean) shift ;;
  --full) LEAN=0; shift ;;
esac
DIR="${1:-.gpu}"
mkdir -p "$DIR"
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh
STAGE="$DIR/stage"
rm -rf "$STAGE" "$DIR/bin"
mkdir -p "$STAGE/bin"
cargo build --release --features cuda,vulkan
cp target/release/tessera "$STAGE/bin/tessera"
# Each test binary's path from cargo's JSON messages, named <crate>-<test>.
if [ "$LEAN" = 1 ]; then
  TESTS=(-p tessera-cuda --test conformance)
else
  TESTS=(-p tessera-cuda -p tessera-vulkan)
fi
{
  cargo test --release "${TESTS[@]}" --no-run --message-format=json
  cargo test --release -p tessera-model --features cuda --lib --no-run --message-format=json
} |
  python3 -c '
import json, shutil, sys
out = sys.argv[1]
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if m.get("reason") != "compiler-artifact" or not exe or not m["profile"]["test"]:
        continue
    crate = m["package_id"].split("#")[-1].split("@")[0].rsplit("/", 1)[-1]
    name = m["target"]["name"].replace("_", "-")
    name = "unit" if name == crate.replace("-", "_").replace("_", "-") else name
    dest = f"{out}/bin/{crate}-{name}"
    shutil.copy(exe, dest)
    print(dest)
' "$STAGE"
strip "$STAGE"/bin/*
# The Vulkan loader and the GL vendor-neutral dispatch (the NVIDIA Vulkan driver needs
# libGLdispatch), for a GPU image that has the driver but not the loader; gpu-check.sh unpacks
# them there only when no libvulkan.so.1 is found. Debian 12's builds run on newer distributions.
# Kept in the cache between runs (one download), copied into each bundle; DIR itself holds only
# what travels.
DEBS="${XDG_CACHE_HOME:-$HOME/.cache}/tessera/vulkan-debs"
rm -rf "$DIR/debs"
mkdir -p "$DEBS"
if ! ls "$DEBS"/libvulkan1_*.deb >/dev/null 2>&1; then
  lists="$(mktemp -d)"
  mkdir -p "$lists/partial"
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
  apt-get "${o[@]}" update -qq &&
    (cd "$DEBS" && apt-get "${o[@]}" download -qq libvulkan1 libglvnd0 libegl1 libgl1 libglx0 \
      libopengl0 libgles2 2>&1 | { grep -v unsandboxed || true; }) ||
    echo "gpu-bundle: could not fetch the Vulkan loader packages; the GPU machine needs its own" >&2
  rm -rf "$lists"
fi
cp -r "$DEBS" "$STAGE/debs"
git rev-parse --short HEAD >"$STAGE/commit"
ls -l "$STAGE/bin"
echo "gpu-bundle: $(du -sh "$STAGE" | cut -f1) unpacked; compressing"
XZ_OPT="${XZ_OPT:--9 -T0}" tar -C "$STAGE" -cJf "$DIR/bundle.tar.xz" .
rm -rf "$STAGE"
ls -l "$DIR/bundle.tar.xz"
carry_check "$DIR"
