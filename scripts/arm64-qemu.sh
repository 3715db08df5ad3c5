#!/usr/bin/env bash
# The CPU backend on arm64, without an arm64 machine: cross-builds the kernel tests, the CPU
# backend's repacked-weight tests, the op conformance suite and the model crate's tests for
# aarch64-unknown-linux-gnu (release) and runs them under qemu-aarch64 on three CPU models, one
# per kernel level, so that every aarch64 path runs and a CPU without an extension never meets
# its instructions:
#
#   cortex-a53   NEON only           kernel tests, repack, op conformance, MoE packing
#   neoverse-n1  NEON + dotprod      kernel tests, repack, op conformance, real models
#   max          + i8mm (and more)   kernel tests, repack, op conformance, reference suite
#
# Weight buffers pack per level (none on NEON, 4 × 4 interleave with dotprod, 4 × 8 with i8mm),
# so the repack tests and the model checks, which load weights into weight buffers, run each
# level's packed kernels as a user's would. On cortex-a53 nothing is packed and its NEON kernels
# are what the kernel tests and the op conformance suite run there, so CI leaves its real models
# (over a minute of emulation) to `--every-level`.
#
# The reference suite is llama.cpp's logits for synthetic models of every architecture and
# dtype (model/src/tests_reference.rs) and for Gemma 3 270M (Q4_K, Q6_K, Q5_0, Q8_0) and SmolLM2
# 135M (Q4_1, Q8_0) ("real models", tests_real.rs). Under QEMU it runs unsplit
# (TESSERA_REFERENCE_MODES=none): the split modes run the same kernels and are architecture-
# independent code that `cargo test --workspace` checks on x86-64, and every mode under
# emulation would cost CI about five more minutes. Every kernel path of every level is covered:
# the kernel tests call each level explicitly (`*_with_isa`) and the op conformance suite runs
# every weight type through the level the CPU model has.
#
# The kernel tests compare every level the CPU has (`*_with_isa`) with the scalar code and with
# ggml's recorded results, so `max` runs all three aarch64 levels; the lower CPU models check that
# detection picks their level and that nothing above it is executed. The reference suite reads
# TESSERA_GEMMA3_GGUF, TESSERA_SMOLLM2_GGUF and the vocabularies as `cargo test` does (CI exports
# them); without them its real-model tests skip with a message.
#
# Installs the cross compiler, qemu-user and the Rust target when missing (Debian/Ubuntu).
# Usage: scripts/arm64-qemu.sh [--quick | --every-mode | --every-level | --build-only]
#   --quick        kernel tests, repack tests and op conformance only
#   --build-only   the installs and the cross build, nothing run (CI builds early, in the background)
#   --every-mode   the reference suite on `max` in every split mode (about 4.5 more minutes)
#   --every-level  the real models (unsplit) on cortex-a53 too
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
QUICK=0
TOP_MODES=none
EVERY_LEVEL=0
BUILD_ONLY=0
case "${1:-}" in
  --quick) QUICK=1 ;;
  --build-only) BUILD_ONLY=1 ;;
  --every-mode) TOP_MODES=none,layer,tensor,expert ;;
  --every-level) EVERY_LEVEL=1 ;;
  "") ;;
  *) echo "usage: $0 [--quick | --every-mode | --every-level | --build-only]" >&2; exit 2 ;;
esac

if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$TARGET"; then
  rustup target add "$TARGET"
fi
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu

echo "== build (release, $TARGET)"
mkdir -p target/ci
cargo test --locked --release --target "$TARGET" -p tessera-kernels -p tessera-model -p tessera-tests \
  -p tessera-cpu --lib --test conformance --test repack --no-run --message-format=json-render-diagnostics \
  >target/ci/arm64-binaries.json
[ "$BUILD_ONLY" = 1 ] && exit 0
binary() {
  python3 - "$1" <<'EOF'
import json, sys
want = sys.argv[1]
for line in open("target/ci/arm64-binaries.json"):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == want:
        print(m["executable"])
        break
EOF
}
KERNELS="$(binary tessera_kernels)"
CONFORMANCE="$(binary conformance)"
MODEL="$(binary tessera_model)"
REPACK="$(binary repack)"
for b in "$KERNELS" "$CONFORMANCE" "$MODEL" "$REPACK"; do
  [ -x "$b" ] || { echo "arm64-qemu: a test binary is missing (see target/ci/arm64-binaries.json)" >&2; exit 1; }
done

run_level() {
  local cpu="$1" level="$2"
  echo "== qemu-aarch64 -cpu $cpu (expects level $level)"
  local detected
  detected="$(qemu-aarch64 -cpu "$cpu" "$KERNELS" --exact cpu::features::tests::ordering_and_parse --nocapture 2>&1 |
    sed -n 's/^detected ISA: \([a-z0-9]*\),.*/\1/p')"
  if [ "$detected" != "$level" ]; then
    echo "arm64-qemu: -cpu $cpu detected '$detected', expected '$level'" >&2
    exit 1
  fi
  qemu-aarch64 -cpu "$cpu" "$KERNELS" -q
  qemu-aarch64 -cpu "$cpu" "$REPACK" -q
  qemu-aarch64 -cpu "$cpu" "$CONFORMANCE" -q
  if [ "$QUICK" = 0 ]; then
    if [ "$level" = i8mm ]; then
      echo "   reference suite (synthetic and real models), modes: $TOP_MODES; MoE packed against plain"
      TESSERA_REFERENCE_MODES=$TOP_MODES qemu-aarch64 -cpu "$cpu" "$MODEL" -q tests_reference tests_real tests_moe \
        --skip quantized_caches
      # The KV cache types (tests_reference_kv): one block pair per kernel family, unsplit; all of
      # them run on x86-64.
      echo "   KV cache types against llama.cpp: three pairs, unsplit"
      TESSERA_REFERENCE_MODES=none \
        TESSERA_REFERENCE_ONLY=llama-f32-gqa.q4_0-q4_0,qwen3-f32-gqa.q8_0-f16,gemma3-f32-mqa-hd256.iq4_nl-iq4_nl \
        qemu-aarch64 -cpu "$cpu" "$MODEL" -q tests_reference_kv
    elif [ "$level" != neon ] || [ "$EVERY_LEVEL" = 1 ]; then
      echo "   real models, unsplit; MoE packed against plain"
      TESSERA_REFERENCE_MODES=none qemu-aarch64 -cpu "$cpu" "$MODEL" -q tests_real tests_moe \
        --skip quantized_caches
    else
      echo "   MoE packed against plain"
      qemu-aarch64 -cpu "$cpu" "$MODEL" -q tests_moe
    fi
  fi
}
run_level cortex-a53 neon
run_level neoverse-n1 dotprod
run_level max i8mm
echo "== arm64 under QEMU: passed"
