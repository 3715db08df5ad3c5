#!/usr/bin/env bash
# Builds the peer for the GPU comparisons on a machine without a GPU: llama.cpp's CUDA backend
# (the copy vendored in the llama-cpp-python sdist that the CPU comparisons use), for sm_90 (the
# H100 and H200 that the device machines have), with the CUDA 13.0 compiler, runtime and cuBLAS
# wheels from PyPI. Packs llama-bench, test-backend-ops and their libraries into DIR/peer.tar.xz
# for scripts/gpu-perf.sh --peer DIR, which runs them beside Tessera in the same call.
#
# Usage: scripts/gpu-peer.sh [DIR]   (default .gpu)
# Installs what it needs from PyPI (the CUDA wheels, CMake, Ninja). Takes about 50 minutes on 2 cores (157 build steps, 144 of them nvcc); WORK (default
# ~/.cache/tessera/gpu-peer) keeps the wheels, the sources and the build, so a second run only
# packs. The binaries need libcudart.so.13 and libcublas(Lt).so.13 at run time: the GPU machine's
# torch environment has them (gpu-perf.sh points LD_LIBRARY_PATH there), so they are not packed.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="$(mkdir -p "${1:-.gpu}" && cd "${1:-.gpu}" && pwd)"
WORK="${WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/gpu-peer}"
SDIST_VERSION=0.3.36
CUDA_PINS=("nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cublas==13.0.*"
  "nvidia-cuda-cccl==13.0.*" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*")
OLDPWD_ROOT="$PWD"
mkdir -p "$WORK"
cd "$WORK"

# The CUDA 13.0 toolkit from wheels: 13.0 matches the GPU machines' driver (580), and the build
# emits sm_90 machine code only, so nothing is compiled from PTX there.
[ -x cu13/bin/pip ] || python3 -m venv cu13
cu13/bin/pip install -q --disable-pip-version-check "${CUDA_PINS[@]}"
# CMake and Ninja from PyPI too (a fresh machine has neither): the build needs nothing from apt.
cu13/bin/pip install -q --disable-pip-version-check "cmake>=3.28,<4" "ninja>=1.11"
NV="$(echo "$WORK"/cu13/lib/python3*/site-packages/nvidia/cu13)"
# The layout CMake's FindCUDAToolkit and nvcc.profile expect: unversioned library names, lib64,
# and a libcuda.so to link against (the real one comes with the driver on the GPU machine).
(cd "$NV/lib" && ln -sf libcudart.so.13 libcudart.so && ln -sf libcublas.so.13 libcublas.so &&
  ln -sf libcublasLt.so.13 libcublasLt.so)
ln -sfn lib "$NV/lib64"
if [ ! -f "$NV/lib/stubs/libcuda.so" ]; then
  mkdir -p "$NV/lib/stubs"
  # Every driver entry point cuda.h declares (after its _v2 renames), as a function that fails:
  # only the symbols matter at link time.
  gcc -E -P -I"$NV/include" "$NV/include/cuda.h" |
    grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' | tr -d ' (' | sort -u |
    sed 's/.*/int &(void) { return 999; }/' >"$NV/lib/stubs/cuda_stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$NV/lib/stubs/libcuda.so" "$NV/lib/stubs/cuda_stub.c"
fi
ln -sf libcuda.so "$NV/lib/stubs/libcuda.so.1"
export PATH="$NV/bin:$WORK/cu13/bin:$PATH" CUDAToolkit_ROOT="$NV"

SRC="$WORK/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
if [ ! -d "$SRC" ]; then
  # --no-binary for this package only: its build requirements come as wheels.
  cu13/bin/pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$SDIST_VERSION" -d .
  tar -xzf "llama_cpp_python-$SDIST_VERSION.tar.gz"
fi
# The CPU part is built plain (AVX2): the GPU runs the model; the host only feeds it.
cmake -S "$SRC" -B "$SRC/build-cuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_F16C=ON -DGGML_FMA=ON \
  -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_CUDA_COMPILER="$NV/bin/nvcc" \
  -DCUDAToolkit_ROOT="$NV" -DGGML_CUDA_NCCL=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$NV/lib:$NV/lib/stubs" >"$WORK/configure.log"
nice -n 5 ninja -C "$SRC/build-cuda" -j "$(nproc)" llama-bench test-backend-ops

PACK="$(mktemp -d)"
mkdir -p "$PACK/peer"
cp "$SRC"/build-cuda/bin/llama-bench "$SRC"/build-cuda/bin/test-backend-ops "$PACK/peer/"
find "$SRC/build-cuda/bin" "$SRC/build-cuda/src" "$SRC/build-cuda/ggml" "$SRC/build-cuda/common" \
  -name 'lib*.so*' -exec cp -P {} "$PACK/peer/" \; 2>/dev/null || true
strip "$PACK"/peer/llama-bench "$PACK"/peer/test-backend-ops
(cd "$SRC" && git describe --always 2>/dev/null || echo "llama-cpp-python $SDIST_VERSION") \
  >"$PACK/peer/version"
tar -C "$PACK" -cJf "$DIR/peer.tar.xz" peer
rm -rf "$PACK"
ls -l "$DIR/peer.tar.xz"
cd "$OLDPWD_ROOT"
# shellcheck source=scripts/gpu-env.sh
. scripts/gpu-env.sh
carry_check "$DIR"
