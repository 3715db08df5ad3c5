#!/usr/bin/env bash
# Speed of the GPU backends against the GPU's own ceilings, measured in one call (issue: GPU
# backends at the hardware's speed). See --help.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
readonly ROOT="$PWD"

usage() {
  cat <<'EOF2'
Usage: scripts/gpu-perf.sh --prebuilt DIR [--peer DIR] [--out DIR] [--budget SECONDS] [--quick]
                           [--no-vulkan] [--sweep] [--no-ops]

On a machine with an NVIDIA GPU, torch and a bundle from scripts/gpu-bundle.sh DIR, within the
budget (default 420 s), each step logged to OUT (default $OUT, else target/gpu-perf):
  files       synthetic llamas written as GGUF files into FILES (default /dev/shm/tessera-perf),
              in the background while the ceilings run: synthetic-1b (1.1B) and synthetic-8b
              (Llama 3 8B's dimensions), each with Q4_0, Q8_0 and Q4_K weights (--quick: Q4_0)
  ceilings    torch: device-to-device copy, bf16 matmul (the GEMM shape at n = 16, 64, 512,
              2048, and 8192^3), a bf16 GEMV, causal scaled_dot_product_attention (d 128,
              32/8 heads, 2048 positions)
  ops-cuda    bench-ops on CUDA0: MUL_MAT 14336x4096 for F16 BF16 Q8_0 Q4_0 Q4_K Q6_K at
              n = 1, 16, 64, 512 and 2048 with 4 weight copies read in turn (past L2),
              FLASH_ATTN_EXT with causal masks, RMS_NORM (--no-ops: left out)
  ops-cuda-peer-shape  MUL_MAT at llama.cpp's test-backend-ops perf shape (m 4096, k 14336,
              n 512) for the same types, beside peer-ops' figures (--no-ops: left out)
  ops-overhead OVERHEAD (64 chained nodes: the per-node cost) on CUDA0, with recorded
              programs and with TESSERA_GPU_REPLAY=0
  ops-vulkan  the same on VK0 through NVIDIA's Vulkan driver (MUL_MAT at n = 1 and 512)
  ops-mma-off (--sweep) the Q8_0/Q4_0/Q4_K GEMMs at n = 512 and the 2048 attention again with
              TESSERA_GPU_MMA=0
              (k_mul_mat_tiled and k_flash_attn_tiled instead of the tensor-core kernels)
  ops-gemv8-off (--sweep) the quantized GEMVs again with TESSERA_GPU_GEMV8=0 (the k_gemv_*
              kernels, which round activations per warp, instead of k_gemv8_* on activations
              rounded once per product), and with G8_UNROLL=4
  fa-chunk-*  (--sweep) the 1.1B and 8B Q4_0 decode (-p 0 -n 128) with TESSERA_GPU_FA_CHUNK =
              128 and 512 keys per block of the split decode attention (default 256)
  peer-*      with --peer DIR (scripts/gpu-peer.sh DIR): llama.cpp's CUDA backend on the same
              files, llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 2
  model-*     tessera bench -m FILE --devices CUDA0 -p 512 -n 128 -r 2 on each file; Q4_0 1.1B
              also split tensor-parallel over cuda:2, and on VK0
  norep-*     the Q4_0 files again with TESSERA_GPU_REPLAY=0 (no CUDA graph replay)
  profile     TESSERA_GPU_PROFILE=1: where a 1.1B Q4_0 decode step's time goes (host phases,
              device span, kernels per op)
  peer-ops    llama.cpp's test-backend-ops perf -o MUL_MAT on CUDA0 (its GEMV/GEMM figures)
  --no-vulkan leaves out ops-vulkan and the VK0 model run (when only CUDA changed)
  GPU_PERF_SKIP  steps to leave out, as shell patterns ("norep-* peer-ops"), to fit a call
  table       every figure as a ratio to its ceiling and to llama.cpp
              (scripts/gpu-perf-table.py), printed last and written as OUT/perf.json and
              OUT/perf.md
EOF2
}

PREBUILT=""
PEER=""
OUTDIR="${OUT:-$ROOT/target/gpu-perf}"
FILES="${GPU_PERF_FILES:-/dev/shm/tessera-perf}"
BUDGET=420
QUICK=0
VULKAN=1
SWEEP=0
RUN_OPS=1
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
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-perf: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$PREBUILT" ] || { echo "gpu-perf: --prebuilt DIR is required (scripts/gpu-bundle.sh DIR)" >&2; exit 2; }
PREBUILT="$(cd "$PREBUILT" 2>/dev/null && pwd)" || { echo "gpu-perf: no bundle folder" >&2; exit 2; }
BIN="$PREBUILT/bin/tessera"
[ -x "$BIN" ] || { echo "gpu-perf: $BIN missing (run scripts/gpu-bundle.sh)" >&2; exit 2; }
mkdir -p "$OUTDIR"
START=$(date +%s)
remaining() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME LIMIT COMMAND...: output to OUTDIR/NAME.log, under the smaller of LIMIT and the
# budget left.
step() {
  local name="$1" limit="$2"; shift 2
  local pat
  for pat in ${GPU_PERF_SKIP:-}; do
    # shellcheck disable=SC2053
    if [[ "$name" == $pat ]]; then
      echo "gpu-perf: $name skipped (GPU_PERF_SKIP)" | tee "$OUTDIR/$name.log" >&2
      return 125
    fi
  done
  local left; left=$(remaining)
  if [ "$left" -lt 15 ]; then
    echo "gpu-perf: $name skipped: the ${BUDGET} s budget is spent" | tee "$OUTDIR/$name.log" >&2
    return 125
  fi
  [ "$limit" -gt $(( left - 5 )) ] && limit=$(( left - 5 ))
  local t0=$(date +%s) rc
  timeout -k 5 "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  rc=$?
  echo "gpu-perf: $name exit $rc in $(( $(date +%s) - t0 )) s (limit $limit)" >&2
  return $rc
}

# shellcheck source=scripts/gpu-env.sh
. "$ROOT/scripts/gpu-env.sh"
prebuilt_env >&2 || echo "gpu-perf: no NVRTC found; the CUDA steps will fail" >&2
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv; 
  echo "commit $(cat "$PREBUILT/commit" 2>/dev/null)"; } >"$OUTDIR/gpu.txt" 2>&1
cat "$OUTDIR/gpu.txt" >&2

# The model files, written while the ceilings and op benchmarks run (the writer is CPU work).
TYPES=(q4_0 q8_0 q4_K)
[ "$QUICK" = 1 ] && TYPES=(q4_0)
MODELS=()
for size in 1b 8b; do for t in "${TYPES[@]}"; do MODELS+=("$size-$t"); done; done
mkdir -p "$FILES"
write_files() {
  local m pids=()
  for m in "${MODELS[@]}"; do
    [ -s "$FILES/$m.gguf" ] && continue
    "$BIN" write-synthetic --model "synthetic-${m%%-*}" --weight-type "${m#*-}" -o "$FILES/$m.gguf" &
    pids+=($!)
  done
  local rc=0 p
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return $rc
}
T_FILES=$(date +%s)
write_files >"$OUTDIR/files.log" 2>&1 &
FILES_PID=$!

M=14336; K=4096
step ceilings 90 python3 "$ROOT/scripts/gpu-ceilings.py" "$OUTDIR/ceilings.json" "$M" "$K"
OPS=()
for t in f16 bf16 q8_0 q4_0 q4_K q6_K; do OPS+=(-o "MUL_MAT(type_a=$t,"); done
OPS+=(-o FLASH_ATTN_EXT -o RMS_NORM)
[ "$RUN_OPS" = 1 ] && step ops-cuda 150 "$BIN" bench-ops --devices CUDA0 -m "$M" -k "$K" -n 1,16,64,512,2048 \
  --rotate 4 --min-time 0.1 "${OPS[@]}"
PEER_SHAPE=()
for t in f16 bf16 q8_0 q4_0 q4_K q6_K; do PEER_SHAPE+=(-o "MUL_MAT(type_a=$t,"); done
[ "$RUN_OPS" = 1 ] && step ops-cuda-peer-shape 60 "$BIN" bench-ops --devices CUDA0 -m 4096 -k 14336 -n 512 \
  --rotate 4 --min-time 0.1 "${PEER_SHAPE[@]}"
# The per-node cost with recorded programs and without (OVERHEAD: 64 chained element-wise nodes).
step ops-overhead 40 "$BIN" bench-ops --devices CUDA0 --min-time 0.2 -o OVERHEAD
step ops-overhead-norep 40 env TESSERA_GPU_REPLAY=0 "$BIN" bench-ops --devices CUDA0 --min-time 0.2 -o OVERHEAD
if [ "$SWEEP" = 1 ]; then
  step ops-mma-off 100 env TESSERA_GPU_MMA=0 "$BIN" bench-ops --devices CUDA0 -m "$M" -k "$K" -n 512 \
    --rotate 4 --min-time 0.1 -o "MUL_MAT(type_a=q8_0," -o "MUL_MAT(type_a=q4_0," -o "MUL_MAT(type_a=q4_K," \
    -o "FLASH_ATTN_EXT(hs=128,nh=32,nh_kv=8,kv=2048,nb=2048"
  GEMV=()
  for t in q8_0 q4_0 q4_K q6_K; do GEMV+=(-o "MUL_MAT(type_a=$t,type_b=f32,m=$M,n=1,"); done
  step ops-gemv8-off 60 env TESSERA_GPU_GEMV8=0 "$BIN" bench-ops --devices CUDA0 -m "$M" \
    -k "$K" --rotate 4 --min-time 0.1 "${GEMV[@]}"
  step ops-gemv8-unroll4 60 env TESSERA_CUDA_DEFINES=G8_UNROLL=4 "$BIN" bench-ops --devices CUDA0 \
    -m "$M" -k "$K" --rotate 4 --min-time 0.1 "${GEMV[@]}"
fi
[ "$VULKAN" = 1 ] && [ "$RUN_OPS" = 1 ] && step ops-vulkan 100 "$BIN" bench-ops --devices VK0 -m "$M" -k "$K" --rotate 4 --min-time 0.1 "${OPS[@]}"
wait "$FILES_PID"
echo "gpu-perf: files exit $? after $(( $(date +%s) - T_FILES )) s: $(ls "$FILES" | tr '\n' ' ')" >&2

# llama.cpp's CUDA backend (scripts/gpu-peer.sh): its libraries beside it, CUDA's runtime and
# cuBLAS from the machine's torch environment.
PEER_BIN=""
if [ -n "$PEER" ]; then
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
for m in "${MODELS[@]}"; do
  f="$FILES/$m.gguf"
  [ -s "$f" ] || { echo "gpu-perf: $f missing (see files.log)" >&2; continue; }
  [ -n "$PEER_BIN" ] && step "peer-$m" 90 env LD_LIBRARY_PATH="$PEER_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$PEER_BIN/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512 -n 128 -r 2 -o md
  step "model-$m" 120 "$BIN" bench -m "$f" --devices CUDA0 --split-mode none -p 512 -n 128 -r 2
  # The same without recorded programs (every node launched every step), for Q4_0.
  [ "${m#*-}" = q4_0 ] && step "norep-$m" 120 env TESSERA_GPU_REPLAY=0 "$BIN" bench -m "$f" \
    --devices CUDA0 --split-mode none -p 512 -n 128 -r 2
done
f1="$FILES/1b-q4_0.gguf"
if [ "$SWEEP" = 1 ]; then
  for c in 128 512; do
    for size in 1b 8b; do
      step "fa-chunk-$c-$size" 40 env TESSERA_GPU_FA_CHUNK=$c "$BIN" bench -m "$FILES/$size-q4_0.gguf" \
        --devices CUDA0 --split-mode none -p 0 -n 128 -r 2
    done
  done
fi
step profile 60 env TESSERA_GPU_PROFILE=1 "$BIN" bench -m "$f1" --devices CUDA0 --split-mode none -p 0 -n 256 -r 1
step model-tp-1b-q4_0 60 "$BIN" bench -m "$f1" --devices cuda:2 --split-mode none,tensor -p 512 -n 128 -r 2
[ "$VULKAN" = 1 ] && step model-vulkan-1b-q4_0 60 "$BIN" bench -m "$f1" --devices VK0 \
  --split-mode none -p 64 -n 32 -r 1
[ -n "$PEER_BIN" ] && step peer-ops 90 env LD_LIBRARY_PATH="$PEER_LD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$PEER_BIN/test-backend-ops" perf -o MUL_MAT -b CUDA0
python3 "$ROOT/scripts/gpu-perf-table.py" "$OUTDIR"
