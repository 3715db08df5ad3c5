#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh --prebuilt runs, on a machine with the toolchain, for a GPU
# machine that has none (no network, no cargo): the release `tessera` with the cuda and vulkan
# features, the tessera-cuda / tessera-vulkan test binaries and the model crate's unit tests with
# the cuda feature (the llama.cpp reference suite), stripped, and the Vulkan loader's Debian
# packages, in one folder (47 MiB on 2026-11-27; the run carries it with the working tree, about
# 10.5 MiB, under the 64 MiB the device tool carries).
#
# Usage: scripts/gpu-bundle.sh [--lean] [DIR]   (default .gpu; then scripts/gpu-check.sh --prebuilt DIR)
# --lean: only what gpu-perf.sh and the CUDA correctness checks run (tessera, the CUDA conformance
# suite, the model crate's unit tests with the reference suite: 21 MiB), leaving room in the
# 64 MiB that travels for llama.cpp's CUDA build (scripts/gpu-peer.sh DIR).
# The binaries link glibc and nothing else at build time: libcuda, NVRTC, NCCL and libvulkan are
# opened at run time, so they run on a newer distribution than the one that built them.
set -euo pipefail
cd "$(dirname "$0")/.."
LEAN=0
if [ "${1:-}" = --lean ]; then
  LEAN=1
  shift
fi
DIR="${1:-.gpu}"
mkdir -p "$DIR/bin"
rm -f "$DIR"/bin/*
cargo build --release --features cuda,vulkan
cp target/release/tessera "$DIR/bin/tessera"
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
' "$DIR"
strip "$DIR"/bin/*
# The Vulkan loader and the GL vendor-neutral dispatch (the NVIDIA Vulkan driver needs
# libGLdispatch), for a GPU image that has the driver but not the loader; gpu-check.sh unpacks
# them there only when no libvulkan.so.1 is found. Debian 12's builds run on newer distributions.
mkdir -p "$DIR/debs"
if [ "$LEAN" = 0 ] && ! ls "$DIR"/debs/libvulkan1_*.deb >/dev/null 2>&1; then
  lists="$(mktemp -d)"
  mkdir -p "$lists/partial"
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
  apt-get "${o[@]}" update -qq &&
    (cd "$DIR/debs" && apt-get "${o[@]}" download -qq libvulkan1 libglvnd0 libegl1 libgl1 libglx0 \
      libopengl0 libgles2 2>&1 | { grep -v unsandboxed || true; }) ||
    echo "gpu-bundle: could not fetch the Vulkan loader packages; the GPU machine needs its own" >&2
  rm -rf "$lists"
fi
git rev-parse --short HEAD >"$DIR/commit"
du -sh "$DIR"
ls -l "$DIR/bin"
