#!/usr/bin/env bash
# Speed of the GPU backends against the GPU's own ceilings, measured in one call (issue: GPU
# backends at the hardware's speed). See --help.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
readonly ROOT="$PWD"

usage() {
  cat <<'EOF2'
Usage: scripts/gpu-perf.sh --prebuilt DIR [--out DIR] [--budget SECONDS] [--quick] [--no-vulkan]

On a machine with an NVIDIA GPU, torch and a bundle from scripts/gpu-bundle.sh DIR, within the
budget (default 330 s), each step logged to OUT (default $OUT, else target/gpu-perf):
  ceilings    torch: device-to-device copy, bf16 matmul (the GEMM shape and 8192^3), a bf16
              GEMV, causal scaled_dot_product_attention (d 128, 32/8 heads, 2048 positions)
  ops-cuda    bench-ops on CUDA0: MUL_MAT 14336x4096 for F16 BF16 Q8_0 Q4_0 Q4_K Q6_K at
              n = 1 and 512 with 4 weight copies read in turn (past L2), FLASH_ATTN_EXT,
              RMS_NORM, OVERHEAD (64 chained nodes)
  ops-vulkan  the same on VK0 through NVIDIA's Vulkan driver
  ops-gv-*    the GEMVs again with other tuning constants of the k_gemv_* kernels through
              TESSERA_CUDA_DEFINES: GV_INT8=0 (f32 activations for Q8_0 / Q4_0), GV_ROWS
              (weight rows per warp; default 2) 4, GV_UNROLL (steps unrolled; default 2) 4
  model-*     bench on the synthetic 1.1B llama: pp512 and tg128 on CUDA0 with Q4_0, Q8_0 and
              Q4_K weights, Q4_0 split tensor-parallel over cuda:2, tg on VK0 (--quick: Q4_0 only)
  --no-vulkan leaves out ops-vulkan and the VK0 model run (when only CUDA changed)
  table       every figure as a ratio to its ceiling (scripts/gpu-perf-table.py), printed last
              and written as OUT/perf.json and OUT/perf.md
EOF2
}

PREBUILT=""
OUTDIR="${OUT:-$ROOT/target/gpu-perf}"
BUDGET=330
QUICK=0
VULKAN=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) PREBUILT="${2:?--prebuilt needs the folder gpu-bundle.sh wrote}"; shift 2 ;;
    --out) OUTDIR="${2:?--out needs a folder}"; shift 2 ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-vulkan) VULKAN=0; shift ;;
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

M=14336; K=4096
step ceilings 90 python3 "$ROOT/scripts/gpu-ceilings.py" "$OUTDIR/ceilings.json" "$M" "$K"
OPS=()
for t in f16 bf16 q8_0 q4_0 q4_K q6_K; do OPS+=(-o "MUL_MAT(type_a=$t,"); done
OPS+=(-o FLASH_ATTN_EXT -o RMS_NORM -o OVERHEAD)
step ops-cuda 100 "$BIN" bench-ops --devices CUDA0 -m "$M" -k "$K" --rotate 4 --min-time 0.1 "${OPS[@]}"
GEMV=()
for t in f16 bf16 q8_0 q4_0 q4_K q6_K; do GEMV+=(-o "MUL_MAT(type_a=$t,type_b=f32,m=$M,n=1,"); done
for v in GV_INT8=0 GV_ROWS=4 GV_UNROLL=4 "GV_ROWS=4 GV_UNROLL=4"; do
  step "ops-gv-${v//[ =]/}" 60 env TESSERA_CUDA_DEFINES="$v" "$BIN" bench-ops --devices CUDA0 -m "$M" \
    -k "$K" --rotate 4 --min-time 0.1 "${GEMV[@]}"
done
[ "$VULKAN" = 1 ] && step ops-vulkan 100 "$BIN" bench-ops --devices VK0 -m "$M" -k "$K" --rotate 4 --min-time 0.1 "${OPS[@]}"
TYPES=(q4_0 q8_0 q4_k)
[ "$QUICK" = 1 ] && TYPES=(q4_0)
for t in "${TYPES[@]}"; do
  step "model-cuda-$t" 60 "$BIN" bench --preset synthetic-1b --weight-type "$t" --devices CUDA0 \
    --split-mode none -p 512 -n 128 -r 2
done
step model-cuda-tp-q4_0 60 "$BIN" bench --preset synthetic-1b --weight-type q4_0 --devices cuda:2 \
  --split-mode none,tensor -p 512 -n 128 -r 2
[ "$VULKAN" = 1 ] && step model-vulkan-q4_0 60 "$BIN" bench --preset synthetic-1b --weight-type q4_0 --devices VK0 \
  --split-mode none -p 64 -n 32 -r 1
python3 "$ROOT/scripts/gpu-perf-table.py" "$OUTDIR"
