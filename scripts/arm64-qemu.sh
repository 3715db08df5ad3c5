#!/usr/bin/env bash
# The CPU backend on arm64, without an arm64 machine: cross-builds the kernel tests, the op
# conformance suite and the model crate's tests for aarch64-unknown-linux-gnu (release) and runs
# them under qemu-aarch64 on three CPU models, one per kernel level, so that every aarch64 path
# runs and a CPU without an extension never meets its instructions:
#
#   cortex-a53   NEON only           kernel tests, op conformance
#   neoverse-n1  NEON + dotprod      kernel tests, op conformance
#   max          + i8mm (and more)   kernel tests, op conformance, the llama.cpp reference suite
#                                    (synthetic models of every architecture, Gemma 3 270M and
#                                    SmolLM2 135M, in every split mode)
#
# The kernel tests compare every level the CPU has (`*_with_isa`) with the scalar code and with
# ggml's recorded results, so `max` runs all three aarch64 levels; the lower CPU models check that
# detection picks their level and that nothing above it is executed. The reference suite reads
# TESSERA_GEMMA3_GGUF, TESSERA_SMOLLM2_GGUF and the vocabularies as `cargo test` does (CI exports
# them); without them its real-model tests skip with a message.
#
# Installs the cross compiler, qemu-user and the Rust target when missing (Debian/Ubuntu).
# Usage: scripts/arm64-qemu.sh [--quick]   (--quick: skip the reference suite)
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1

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
  --lib --test conformance --no-run --message-format=json-render-diagnostics >target/ci/arm64-binaries.json
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
for b in "$KERNELS" "$CONFORMANCE" "$MODEL"; do
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
  qemu-aarch64 -cpu "$cpu" "$CONFORMANCE" -q
}
run_level cortex-a53 neon
run_level neoverse-n1 dotprod
run_level max i8mm
if [ "$QUICK" = 0 ]; then
  echo "== qemu-aarch64 -cpu max: the llama.cpp reference suite"
  qemu-aarch64 -cpu max "$MODEL" tests_reference tests_real
fi
echo "== arm64 under QEMU: passed"
