#!/usr/bin/env bash
# The prepared GPU call: conformance first (per op), then speed against the GPU's own ceilings
# and llama.cpp's CUDA backend, measured in one call, everything it wrote packed into one archive
# beside perf.md. See --help.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
readonly ROOT="$PWD"
# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"

usage() {
  cat <<'EOF2'
Usage: scripts/gpu-perf.sh --prebuilt DIR [--peer DIR] [--out DIR] [--budget SECONDS] [--quick]
                           [--no-vulkan] [--sweep] [--no-ops] [--drop N]
       scripts/gpu-perf.sh --selftest --bin TESSERA [--conformance BIN] [--out DIR]

On a machine with an NVIDIA GPU, torch and a bundle from scripts/gpu-bundle.sh DIR (its
bundle.tar.xz, or the unpacked bin/), within the budget (default 480 s), in this order:
  conformance-OP  the CUDA conformance suite (tessera-cuda-conformance) one process per op, four
              at a time, so a kernel that crashes the context costs only its op's cases. If
              MUL_MAT, MUL_MAT_ID or FLASH_ATTN_EXT fails, that op runs again with
              TESSERA_GPU_MMA=0 (conformance-OP-mma-off); when the plain kernels pass, the rest
              of the run sets TESSERA_GPU_MMA=0 and perf.md says why
  files       synthetic llamas written as GGUF files into FILES (default /dev/shm/tessera-perf),
              in the background from the start: synthetic-1b (1.1B) and synthetic-8b (Llama 3
              8B's dimensions), each with Q4_0, Q8_0 and Q4_K weights (--quick: Q4_0)
  reference   the llama.cpp reference suite on CUDA (tessera-model-unit tests_reference::synthetic)
  ceilings    torch: device-to-device copy, bf16 matmul (the GEMM shape at n = 16, 64, 512,
              2048, and 8192^3), a bf16 GEMV, causal scaled_dot_product_attention (d 128,
              32/8 heads, 2048 positions)
  peer-*, model-*  with --peer DIR (scripts/gpu-peer.sh DIR): llama.cpp's CUDA backend on each
              file (llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 2), then tessera bench -m FILE
              --devices CUDA0 -p 512 -n 128 -r 2 on the same file
  profile     TESSERA_GPU_PROFILE=1: where a 1.1B Q4_0 decode step's time goes
  ops-cuda    bench-ops on CUDA0: MUL_MAT 14336x4096 for F16 BF16 Q8_0 Q4_0 Q4_K Q6_K at
              n = 1, 16, 64, 512 and 2048 with 4 weight copies read in turn (past L2),
              FLASH_ATTN_EXT with causal masks, RMS_NORM (--no-ops: left out)
  ops-cuda-peer-shape, peer-ops  MUL_MAT at llama.cpp's test-backend-ops perf shape (m 4096,
              k 14336, n 512), and llama.cpp's own test-backend-ops perf -o MUL_MAT
  ops-overhead, ops-overhead-norep  OVERHEAD (64 chained nodes: the per-node cost) on CUDA0,
              with recorded programs and with TESSERA_GPU_REPLAY=0
  norep-*     the Q4_0 files again with TESSERA_GPU_REPLAY=0 (no CUDA graph replay)
  model-tp-1b-q4_0  the 1.1B Q4_0 file split tensor-parallel over cuda:2
  ops-vulkan, model-vulkan-1b-q4_0  the same on VK0 through NVIDIA's Vulkan driver
              (--no-vulkan: left out; the bundle carries the Vulkan loader)
  --sweep     also ops-mma-off (the GEMMs at n = 512 and the 2048 attention with
              TESSERA_GPU_MMA=0), ops-gemv8-off / ops-gemv8-unroll4 (the GEMVs with
              TESSERA_GPU_GEMV8=0 and G8_UNROLL=4), fa-chunk-* (128 and 512 keys per block)
  table       scripts/gpu-perf-table.py: every figure as a ratio to its ceiling and to
              llama.cpp, and a "Problems" list of every row a step that ran should have given
Each step prints its name, exit status and seconds as it ends, and goes to LOGS/steps.tsv.

Fitting a call: GPU_PERF_SKIP (shell patterns of step names, e.g. "norep-* peer-ops") leaves
steps out; --drop N leaves out the first N groups of the drop order, least needed first:
  fa-chunk-*  ops-gemv8-*  ops-mma-off  ops-overhead-norep  norep-*  ops-vulkan
  model-vulkan-*  model-tp-*  peer-ops  ops-cuda-peer-shape  ops-cuda  profile  reference
  *-8b-*
What comes back: OUT (default $OUT, else target/gpu-perf) receives exactly two files,
perf.md and gpu-perf.tar.xz (every log, steps.tsv, perf.json, the conformance output); the logs
themselves are written to LOGS (default /tmp/tessera-gpu-perf, or OUT/logs with --selftest).

--selftest runs the same steps on the CPU device of TESSERA (a CI build) with small shapes, the
tiny synthetic model, the ceilings and the llama.cpp tables recorded in
scripts/fixtures/gpu-perf/, and the table with --strict: it fails when a row the table expects
is missing, so a change to what the binaries print cannot empty a GPU run's table unseen.
--conformance BIN (with --selftest: the CPU conformance suite) and GPU_PERF_OPS (the ops to run
it for; default "all": every op its --list names; the selftest's default is ADD and RMS_NORM)
pick the conformance runs.
EOF2
}

PREBUILT=""
PEER=""
OUTDIR="${OUT:-$ROOT/target/gpu-perf}"
FILES="${GPU_PERF_FILES:-/dev/shm/tessera-perf}"
BUDGET=480
QUICK=0
VULKAN=1
SWEEP=0
RUN_OPS=1
DROP=0
SELFTEST=0
BIN=""
CONF_BIN=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) PREBUILT="${2:?--prebuilt needs the folder gpu-bundle.sh wrote}"; shift 2 ;;
    --peer) PEER="${2:?--peer needs the folder gpu-peer.sh wrote}"; shift 2 ;;
    --out) OUTDIR="${2:?--out needs a folder}"; shift 2 ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-vulkan) VULKAN=0; shift ;;
    --sweep) SWEEP=1; shift ;;
    --no-ops) RUN_OPS=0; shift ;;
    --drop) DROP="${2:?--drop needs a count}"; shift 2 ;;
    --selftest) SELFTEST=1; shift ;;
    --bin) BIN="${2:?--bin needs the tessera binary}"; shift 2 ;;
    --conformance) CONF_BIN="${2:?--conformance needs a test binary}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-perf: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$DROP" =~ ^[0-9]+$ ]] || { echo "gpu-perf: --drop takes a count" >&2; exit 2; }
mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
if [ "$SELFTEST" = 1 ]; then
  LOGS="${GPU_PERF_LOGS:-$OUTDIR/logs}"
  FILES="$OUTDIR/files"
else
  LOGS="${GPU_PERF_LOGS:-/tmp/tessera-gpu-perf}"
fi
rm -rf "$LOGS"
mkdir -p "$LOGS"
: >"$LOGS/steps.tsv"

# --- what runs where -------------------------------------------------------------------------
if [ "$SELFTEST" = 1 ]; then
  [ -x "$BIN" ] || { echo "gpu-perf: --selftest needs --bin TESSERA (a built tessera)" >&2; exit 2; }
  BIN="$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")"
  DEV=CPU TP=cpu:2 SIZES=(tiny) TYPES=(q4_0 q8_0)
  M=256 K=256 NS=1,16 OP_TYPES=(f16 q4_0) PEER_N=2 PEER_TYPES=(q4_0)
  FA_CASE="FLASH_ATTN_EXT(hs=128,nh=32,nh_kv=8,kv=256,nb=1," FA_MMA="$FA_CASE"
  MMA_TYPES=(q4_0) GEMV_TYPES=(q4_0)
  REPEAT=1 MIN_TIME=0.01 ROTATE=2 VK_P=16 VK_N=4
  FIXTURES="$ROOT/scripts/fixtures/gpu-perf"
  BUDGET=600
  # Not on a CPU: torch's ceilings (recorded), the GPU profile, the reference suite (the README's
  # test command runs it), and the 2048-position attention (minutes in a debug build).
  GPU_PERF_SKIP="${GPU_PERF_SKIP:-} profile reference"
  # (Read whole first: grep -q would end the pipe early, and pipefail take that as a failure.)
  devs="$("$BIN" devices 2>/dev/null)"
  grep -q '^vulkan.*: [1-9][0-9]* device' <<<"$devs" || VULKAN=0
  GPU_PERF_OPS="${GPU_PERF_OPS:-ADD RMS_NORM}"
else
  [ -n "$PREBUILT" ] || { echo "gpu-perf: --prebuilt DIR is required (scripts/gpu-bundle.sh DIR)" >&2; exit 2; }
  PREBUILT="$(unpack_bundle "$PREBUILT")" || { echo "gpu-perf: no bundle in $PREBUILT" >&2; exit 2; }
  BIN="$PREBUILT/bin/tessera"
  [ -x "$BIN" ] || { echo "gpu-perf: $BIN missing (run scripts/gpu-bundle.sh)" >&2; exit 2; }
  CONF_BIN="${CONF_BIN:-$PREBUILT/bin/tessera-cuda-conformance}"
  DEV=CUDA0 TP=cuda:2 SIZES=(1b 8b) TYPES=(q4_0 q8_0 q4_K)
  [ "$QUICK" = 1 ] && TYPES=(q4_0)
  M=14336 K=4096 NS=1,16,64,512,2048 OP_TYPES=(f16 bf16 q8_0 q4_0 q4_K q6_K) PEER_N=512
  PEER_TYPES=("${OP_TYPES[@]}") FA_CASE=FLASH_ATTN_EXT
  FA_MMA="FLASH_ATTN_EXT(hs=128,nh=32,nh_kv=8,kv=2048,nb=2048" MMA_TYPES=(q8_0 q4_0 q4_K)
  GEMV_TYPES=(q8_0 q4_0 q4_K q6_K)
  REPEAT=2 MIN_TIME=0.1 ROTATE=4 VK_P=64 VK_N=32
fi
VKDEV=VK0
START=$(date +%s)
remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }

DROP_ORDER=("fa-chunk-*" "ops-gemv8-*" "ops-mma-off" "ops-overhead-norep" "norep-*" "ops-vulkan"
  "model-vulkan-*" "model-tp-*" "peer-ops" "ops-cuda-peer-shape" "ops-cuda" "profile" "reference" "*-8b-*")
SKIPS="${GPU_PERF_SKIP:-} ${DROP_ORDER[*]:0:$DROP}"

# step NAME LIMIT COMMAND...: output to LOGS/NAME.log, under the smaller of LIMIT and the
# budget left; one line in LOGS/steps.tsv (name, exit status, seconds, limit; 125 = skipped).
step() {
  local name="$1" limit="$2"; shift 2
  local pat
  for pat in $SKIPS; do
    # shellcheck disable=SC2053
    if [[ "$name" == $pat ]]; then
      echo "gpu-perf: $name skipped (GPU_PERF_SKIP / --drop: $pat)" | tee "$LOGS/$name.log" >&2
      printf '%s\t125\t0\t0\n' "$name" >>"$LOGS/steps.tsv"
      return 125
    fi
  done
  local left; left=$(remaining)
  if [ "$left" -lt 15 ]; then
    echo "gpu-perf: $name skipped: the ${BUDGET} s budget is spent" | tee "$LOGS/$name.log" >&2
    printf '%s\t125\t0\t0\n' "$name" >>"$LOGS/steps.tsv"
    return 125
  fi
  [ "$limit" -gt $(( left - 5 )) ] && limit=$(( left - 5 ))
  local t0; t0=$(date +%s)
  local rc
  timeout -k 5 "$limit" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  local dt=$(( $(date +%s) - t0 ))
  printf '%s\t%d\t%d\t%d\n' "$name" "$rc" "$dt" "$limit" >>"$LOGS/steps.tsv"
  echo "gpu-perf: $name exit $rc in $dt s (limit $limit; $(( $(date +%s) - START )) s since the start)" >&2
  return $rc
}

# finish: the table, then OUT's two files: perf.md and the archive of everything in LOGS.
finish() {
  local strict=() p
  for p in $(cat "$LOGS/files.pids" 2>/dev/null); do kill "$p" 2>/dev/null; done
  [ "$SELFTEST" = 1 ] && strict=(--strict --device "$DEV")
  python3 "$ROOT/scripts/gpu-perf-table.py" "$LOGS" "${strict[@]}"
  local rc=$?
  cp "$LOGS/perf.md" "$OUTDIR/perf.md" 2>/dev/null
  if [ "$SELFTEST" = 0 ]; then
    tar -C "$(dirname "$LOGS")" -cJf "$OUTDIR/gpu-perf.tar.xz" "$(basename "$LOGS")" &&
      echo "gpu-perf: $OUTDIR/perf.md and $OUTDIR/gpu-perf.tar.xz ($(du -k "$OUTDIR/gpu-perf.tar.xz" | cut -f1) KiB)" >&2
  fi
  echo "gpu-perf: done in $(( $(date +%s) - START )) s" >&2
  return $rc
}

# Stopped from outside (a timeout): still leave the table and the archive of what ran.
trap 'echo "gpu-perf: stopped; packing what ran" >&2; finish; exit 1' TERM INT

if [ "$SELFTEST" = 0 ]; then
  prebuilt_env >&2 || echo "gpu-perf: no NVRTC found; the CUDA steps will fail" >&2
  { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    echo "commit $(cat "$PREBUILT/commit" 2>/dev/null)"; } >"$LOGS/gpu.txt" 2>&1
else
  { grep -m1 'model name' /proc/cpuinfo; echo "commit $(git rev-parse --short HEAD 2>/dev/null)"; } >"$LOGS/gpu.txt"
fi
cat "$LOGS/gpu.txt" >&2

# --- the model files: written from the start, in the background (CPU work) -------------------
MODELS=()
for size in "${SIZES[@]}"; do for t in "${TYPES[@]}"; do MODELS+=("$size-$t"); done; done
mkdir -p "$FILES"
write_files() {
  local m pids=() preset
  for m in "${MODELS[@]}"; do
    [ -s "$FILES/$m.gguf" ] && continue
    preset="synthetic-${m%%-*}"
    [ "${m%%-*}" = tiny ] && preset=tiny
    "$BIN" write-synthetic --model "$preset" --weight-type "${m#*-}" -o "$FILES/$m.gguf" &
    pids+=($!)
    echo $! >>"$LOGS/files.pids"
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
T_FILES=$(date +%s)
# Its exit status goes to a file: the conformance pool below waits for its own jobs only.
# It holds none of the script's output: a writer still running at the end (the budget spent)
# must not keep the caller waiting on the pipe; `finish` ends it.
{ write_files >"$LOGS/files.log" 2>&1; echo $? >"$LOGS/files.rc"; } >/dev/null 2>&1 </dev/null &

# --- conformance, one process per op ---------------------------------------------------------
# The ops of the suite, from its trial names (DEVICE/OP(params) or [skipped: ...] DEVICE/OP...).
conformance_ops() {
  "$CONF_BIN" --list 2>/dev/null | sed -n 's/: test$//p' | sed 's/^\[[^]]*\] //' |
    sed -E 's#^([^(]*/)?([A-Z0-9_]+).*#\2#' | sort -u
}
if [ -z "$CONF_BIN" ] || [ ! -x "$CONF_BIN" ]; then
  # A step that fails with the reason in its log, so that perf.md's Problems names it.
  step conformance 5 sh -c 'echo "no conformance binary ($1): conformance not run"; exit 2' _ "${CONF_BIN:-none given}"
else
  OPS_LIST="${GPU_PERF_OPS:-all}"
  [ "$OPS_LIST" = all ] && OPS_LIST="$(conformance_ops | tr '\n' ' ')"
  [ -n "${OPS_LIST// /}" ] || echo "gpu-perf: $CONF_BIN --list named no op" >&2
  # A missing GPU fails the suite instead of skipping it (the selftest's CPU suite has no GPU).
  [ "$SELFTEST" = 0 ] && export TESSERA_REQUIRE=cuda
  T_CONF=$(date +%s)
  live() { local n=0 p; for p in "$@"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done; echo "$n"; }
  pool=()
  for op in $OPS_LIST; do
    # Four at a time; libtest's filter is a substring: "/MUL_MAT(" leaves MUL_MAT_ID out.
    step "conformance-$op" 240 "$CONF_BIN" "/$op(" --test-threads 4 &
    pool+=($!)
    while [ "$(live "${pool[@]}")" -ge 4 ]; do sleep 0.2; done
  done
  for p in "${pool[@]}"; do wait "$p"; done
  # The tensor-core tile kernels serve these ops: when one fails with them, try it without.
  for op in MUL_MAT MUL_MAT_ID FLASH_ATTN_EXT; do
    rc="$(awk -F'\t' -v n="conformance-$op" '$1 == n { print $2 }' "$LOGS/steps.tsv")"
    if [ -n "$rc" ] && [ "$rc" != 0 ] && [ "$rc" != 125 ]; then
      if step "conformance-$op-mma-off" 240 env TESSERA_GPU_MMA=0 "$CONF_BIN" "/$op(" --test-threads 4; then
        export TESSERA_GPU_MMA=0
        echo "tile kernels off (TESSERA_GPU_MMA=0): conformance-$op failed with them and passed without" |
          tee -a "$LOGS/gpu.txt" >&2
      fi
    fi
  done
  echo "gpu-perf: conformance of $(wc -w <<<"$OPS_LIST") op(s) in $(( $(date +%s) - T_CONF )) s" >&2
  [ "$SELFTEST" = 0 ] && unset TESSERA_REQUIRE
fi

# --- the llama.cpp reference suite -----------------------------------------------------------
if [ "$SELFTEST" = 0 ] && [ -x "$PREBUILT/bin/tessera-model-unit" ]; then
  step reference 150 env TESSERA_REFERENCE_BACKEND=cuda TESSERA_REFERENCE_MODES=none \
    TESSERA_REFERENCE_DIR="$ROOT/tests/reference/synthetic" \
    "$PREBUILT/bin/tessera-model-unit" tests_reference::synthetic --nocapture
else
  step reference 5 sh -c 'echo "no tessera-model-unit in the bundle: the reference suite did not run"; exit 2'
fi

# --- ceilings --------------------------------------------------------------------------------
if [ "$SELFTEST" = 1 ]; then
  step ceilings 10 cp "$FIXTURES/ceilings.json" "$LOGS/ceilings.json"
else
  step ceilings 90 python3 "$ROOT/scripts/gpu-ceilings.py" "$LOGS/ceilings.json" "$M" "$K"
fi

while [ ! -s "$LOGS/files.rc" ] && [ "$(remaining)" -gt 15 ]; do sleep 0.5; done
files_rc="$(cat "$LOGS/files.rc" 2>/dev/null || echo 124)"
printf 'files\t%d\t%d\t0\n' "$files_rc" "$(( $(date +%s) - T_FILES ))" >>"$LOGS/steps.tsv"
echo "gpu-perf: files exit $files_rc after $(( $(date +%s) - T_FILES )) s: $(ls "$FILES" | tr '\n' ' ')" >&2

# --- llama.cpp beside Tessera, file by file --------------------------------------------------
# llama.cpp's CUDA backend (scripts/gpu-peer.sh): its libraries beside it, CUDA's runtime and
# cuBLAS from the machine's torch environment. The selftest reads recorded tables instead.
PEER_BIN=""
if [ "$SELFTEST" = 1 ]; then
  PEER_BIN=fixtures
elif [ -n "$PEER" ]; then
  if [ -f "$PEER/peer.tar.xz" ] && tar -C /tmp -xJf "$PEER/peer.tar.xz"; then
    PEER_BIN=/tmp/peer
    cu13="$(python3 -c 'import nvidia, os; print(next(os.path.join(p, "cu13", "lib") for p in nvidia.__path__ if os.path.isdir(os.path.join(p, "cu13", "lib"))))' 2>/dev/null)"
    # Then the CUDA toolkit's own (the GPU image has one), should torch's wheels lack a library.
    export PEER_LD="$PEER_BIN${cu13:+:$cu13}:/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/cuda/lib64"
    echo "gpu-perf: peer $(cat "$PEER_BIN/version" 2>/dev/null); CUDA libraries from ${cu13:-nowhere (none found)}" >&2
  else
    echo "gpu-perf: no $PEER/peer.tar.xz (run scripts/gpu-peer.sh $PEER): no llama.cpp figures" >&2
  fi
fi
# peer NAME PROGRAM ARGS...: the command of step NAME, in PEER_CMD (the selftest: its recording).
peer() {
  local name="$1"
  shift
  if [ "$PEER_BIN" = fixtures ]; then
    PEER_CMD=(cat "$FIXTURES/$name.log")
  else
    PEER_CMD=(env LD_LIBRARY_PATH="$PEER_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$PEER_BIN/$@")
  fi
}
for m in "${MODELS[@]}"; do
  f="$FILES/$m.gguf"
  [ -s "$f" ] || { echo "gpu-perf: $f missing (see files.log)" >&2; continue; }
  if [ -n "$PEER_BIN" ]; then
    peer "peer-$m" llama-bench -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 2 -o md
    step "peer-$m" 90 "${PEER_CMD[@]}"
  fi
  step "model-$m" 120 "$BIN" bench -m "$f" --devices "$DEV" --split-mode none -p 512 -n 128 -r "$REPEAT"
done
F1="$FILES/${MODELS[0]}.gguf"
step profile 60 env TESSERA_GPU_PROFILE=1 "$BIN" bench -m "$F1" --devices "$DEV" --split-mode none -p 0 -n 256 -r 1

# --- op benchmarks ---------------------------------------------------------------------------
OPS=()
for t in "${OP_TYPES[@]}"; do OPS+=(-o "MUL_MAT(type_a=$t,"); done
OPS+=(-o "$FA_CASE" -o RMS_NORM)
[ "$RUN_OPS" = 1 ] && step ops-cuda 150 "$BIN" bench-ops --devices "$DEV" -m "$M" -k "$K" -n "$NS" \
  --rotate "$ROTATE" --min-time "$MIN_TIME" "${OPS[@]}"
PEER_SHAPE=()
for t in "${PEER_TYPES[@]}"; do PEER_SHAPE+=(-o "MUL_MAT(type_a=$t,"); done
[ "$RUN_OPS" = 1 ] && step ops-cuda-peer-shape 60 "$BIN" bench-ops --devices "$DEV" -m 4096 -k 14336 \
  -n "$PEER_N" --rotate "$ROTATE" --min-time "$MIN_TIME" "${PEER_SHAPE[@]}"
if [ -n "$PEER_BIN" ]; then
  peer peer-ops test-backend-ops perf -o MUL_MAT -b CUDA0
  step peer-ops 90 "${PEER_CMD[@]}"
fi
# The per-node cost with recorded programs and without (OVERHEAD: 64 chained element-wise nodes).
step ops-overhead 40 "$BIN" bench-ops --devices "$DEV" --min-time "$MIN_TIME" -o OVERHEAD
step ops-overhead-norep 40 env TESSERA_GPU_REPLAY=0 "$BIN" bench-ops --devices "$DEV" --min-time "$MIN_TIME" -o OVERHEAD
# The same without recorded programs (every node launched every step), for the Q4_0 files.
for m in "${MODELS[@]}"; do
  [ "${m#*-}" = q4_0 ] && [ -s "$FILES/$m.gguf" ] && step "norep-$m" 120 env TESSERA_GPU_REPLAY=0 \
    "$BIN" bench -m "$FILES/$m.gguf" --devices "$DEV" --split-mode none -p 512 -n 128 -r "$REPEAT"
done
step "model-tp-${MODELS[0]}" 60 "$BIN" bench -m "$F1" --devices "$TP" --split-mode none,tensor -p 512 \
  -n 128 -r "$REPEAT"
if [ "$VULKAN" = 1 ]; then
  [ "$RUN_OPS" = 1 ] && step ops-vulkan 100 "$BIN" bench-ops --devices "$VKDEV" -m "$M" -k "$K" -n 1,16 \
    --rotate "$ROTATE" --min-time "$MIN_TIME" "${OPS[@]}"
  step "model-vulkan-${MODELS[0]}" 60 "$BIN" bench -m "$F1" --devices "$VKDEV" --split-mode none \
    -p "$VK_P" -n "$VK_N" -r 1
fi
if [ "$SWEEP" = 1 ] || [ "$SELFTEST" = 1 ]; then
  MMA=()
  for t in "${MMA_TYPES[@]}"; do MMA+=(-o "MUL_MAT(type_a=$t,"); done
  step ops-mma-off 100 env TESSERA_GPU_MMA=0 "$BIN" bench-ops --devices "$DEV" -m "$M" -k "$K" \
    -n "$PEER_N" --rotate "$ROTATE" --min-time "$MIN_TIME" "${MMA[@]}" -o "$FA_MMA"
  GEMV=()
  for t in "${GEMV_TYPES[@]}"; do GEMV+=(-o "MUL_MAT(type_a=$t,type_b=f32,m=$M,n=1,"); done
  step ops-gemv8-off 60 env TESSERA_GPU_GEMV8=0 "$BIN" bench-ops --devices "$DEV" -m "$M" -k "$K" -n 1 \
    --rotate "$ROTATE" --min-time "$MIN_TIME" "${GEMV[@]}"
  step ops-gemv8-unroll4 60 env TESSERA_CUDA_DEFINES=G8_UNROLL=4 "$BIN" bench-ops --devices "$DEV" \
    -m "$M" -k "$K" -n 1 --rotate "$ROTATE" --min-time "$MIN_TIME" "${GEMV[@]}"
  for c in 128 512; do
    for size in "${SIZES[@]}"; do
      [ -s "$FILES/$size-q4_0.gguf" ] && step "fa-chunk-$c-$size" 40 env TESSERA_GPU_FA_CHUNK=$c "$BIN" bench \
        -m "$FILES/$size-q4_0.gguf" --devices "$DEV" --split-mode none -p 0 -n 128 -r "$REPEAT"
    done
  done
fi
finish
