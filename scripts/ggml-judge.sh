#!/usr/bin/env bash
# llama.cpp, unmodified, judges Tessera's devices through the ggml bridge (ggml-bridge/,
# libggml_tessera.so):
#   1. builds llama.cpp from the llama-cpp-python 0.3.36 sdist with dynamic backends
#      (GGML_BACKEND_DL), only the targets the judge runs; kept in LLAMA_DL_DIR (default
#      ${XDG_CACHE_HOME:-~/.cache}/tessera/llama.cpp-dl-0.3.36) and reused when built;
#   2. builds the plugin (release) with the Tessera backends this machine can test;
#   3. runs test-backend-ops (mode test: every case against ggml's CPU backend) on each Tessera
#      device and prints a table per op of passed / failed / not supported; any failure fails;
#   4. with --models FILE[=PROMPT_FILE],..: llama-completion greedy (16 tokens) on each model once
#      on ggml's CPU backend and once with every layer on TesseraCPU (the same text, or failure),
#      and llama-bench of both (not with --no-bench: CI, where speed means nothing);
#   5. with --split LIST (a Tessera device list, e.g. cpu:2): the plugin offers TesseraMETA, a
#      tensor split over LIST (TESSERA_GGML_SPLIT), which --devices may name; the models' greedy
#      text runs on it too (2 threads in all), and llama-bench with it.
#
#   scripts/ggml-judge.sh [--devices SPEC,..] [--models A.gguf,B.gguf] [--features cpu,vulkan]
#                         [--split LIST] [--profile release|test] [--jobs N] [--no-bench]
#                         [--build-only]
#
# --build-only stops after step 1, having built what the same arguments would run (CI builds
# llama.cpp early, in the background, then runs the judge with the same --models and --no-bench).
#
# A device SPEC is a ggml device name (TesseraCPU, TesseraSYCL0, TesseraVK0), optionally with the
# ops to test and a regex over their parameters, as test-backend-ops' -o and -p take them:
# `TesseraVK0@ADD,MUL_MAT@type_a=f32`; a device may be listed again with other ops. Without ops
# every case runs. --profile test builds the
# plugin with cargo's test profile (optimised, and sharing what `cargo test` already built).
# Needs cmake, a C++ compiler and python3; the sdist comes from PyPI (pip download).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
readonly SDIST_VERSION=0.3.36
ME=ggml-judge
log() { printf '%s: %s\n' "$ME" "$*" >&2; }
die() { printf '%s: error: %s\n' "$ME" "$*" >&2; exit 1; }

DEVICES=TesseraCPU
MODELS=""
FEATURES=cpu
PROFILE=release
JOBS=1
BENCH=1
BUILD_ONLY=0
SPLIT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --devices) DEVICES="${2:?--devices needs a list}"; shift 2 ;;
    --models) MODELS="${2:?--models needs a list}"; shift 2 ;;
    --features) FEATURES="${2:?--features needs a list}"; shift 2 ;;
    --split) SPLIT="${2:?--split needs a device list}"; shift 2 ;;
    --profile) PROFILE="${2:?--profile needs a name}"; shift 2 ;;
    --jobs) JOBS="${2:?--jobs needs a number}"; shift 2 ;;
    --no-bench) BENCH=0; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

LLAMA_DL_DIR="${LLAMA_DL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/llama.cpp-dl-$SDIST_VERSION}"
BIN="$LLAMA_DL_DIR/build/bin"
PY="${PYTHON:-python3}"
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"

# The x86 extensions ggml builds for: each on exactly when this CPU has it (a forced AVX_VNNI
# dies with SIGILL on Zen 4), as scripts/compare-llama-cpp.sh does.
isa_flags() {
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

TARGETS="test-backend-ops ggml-cpu"
[ -n "$MODELS" ] && TARGETS="$TARGETS llama-completion"
[ -n "$MODELS" ] && [ "$BENCH" = 1 ] && TARGETS="$TARGETS llama-bench"
need_build=0
for t in $TARGETS; do
  case "$t" in
    ggml-cpu) ls "$BIN"/libggml-cpu*.so >/dev/null 2>&1 || need_build=1 ;;
    *) [ -x "$BIN/$t" ] || need_build=1 ;;
  esac
done
if [ "$need_build" = 1 ]; then
  command -v cmake >/dev/null 2>&1 || die "building llama.cpp needs cmake (apt-get install cmake)"
  if [ ! -f "$LLAMA_DL_DIR/CMakeLists.txt" ]; then
    tmp="$(mktemp -d)"
    log "fetching llama-cpp-python==$SDIST_VERSION (sdist) for its vendored llama.cpp"
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$SDIST_VERSION" -d "$tmp"
    mkdir -p "$LLAMA_DL_DIR"
    tar -xzf "$tmp/llama_cpp_python-$SDIST_VERSION.tar.gz" -C "$LLAMA_DL_DIR" --strip-components=3 \
      "llama_cpp_python-$SDIST_VERSION/vendor/llama.cpp"
    rm -rf "$tmp"
  fi
  # shellcheck disable=SC2046 # one word per flag
  cmake -S "$LLAMA_DL_DIR" -B "$LLAMA_DL_DIR/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF $(isa_flags) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
    -DGGML_AMX_BF16=OFF -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=OFF \
    -DLLAMA_BUILD_TESTS=ON >"$LLAMA_DL_DIR/configure.log" 2>&1 ||
    { tail -n 20 "$LLAMA_DL_DIR/configure.log" >&2; die "cmake configure failed"; }
  log "building $TARGETS"
  t0=$SECONDS
  # shellcheck disable=SC2086
  cmake --build "$LLAMA_DL_DIR/build" -j "$(nproc)" --target $TARGETS >"$LLAMA_DL_DIR/build.log" 2>&1 ||
    { tail -n 30 "$LLAMA_DL_DIR/build.log" >&2; die "building llama.cpp failed"; }
  log "llama.cpp built in $((SECONDS - t0)) s"
fi
[ "$BUILD_ONLY" = 1 ] && exit 0

log "building the plugin (features $FEATURES, profile $PROFILE)"
t0=$SECONDS
cargo build -q --profile "$PROFILE" -p tessera-ggml --no-default-features --features "$FEATURES"
case "$PROFILE" in
  release) PLUGIN="$ROOT/target/release/libggml_tessera.so" ;;
  *) PLUGIN="$ROOT/target/debug/libggml_tessera.so" ;;
esac
[ -f "$PLUGIN" ] || die "no $PLUGIN"
log "plugin built in $((SECONDS - t0)) s"
export GGML_BACKEND_PATH="$PLUGIN"
if [ -n "$SPLIT" ]; then
  export TESSERA_GGML_SPLIT="$SPLIT"
else
  unset TESSERA_GGML_SPLIT
fi

status=0
mkdir -p target/ggml-judge
# `@` separates a device from its ops and parameter filter; ops are comma-separated too, so the
# list is split on commas that start a new device (a name beginning with Tessera).
devs=()
while IFS= read -r word; do
  if [[ $word == Tessera* ]] || [ ${#devs[@]} -eq 0 ]; then
    devs+=("$word")
  else
    devs[-1]="${devs[-1]},$word"
  fi
done < <(tr ',' '\n' <<<"$DEVICES")
for i in "${!devs[@]}"; do
  IFS=@ read -r dev ops params <<<"${devs[$i]}"
  out="target/ggml-judge/test-backend-ops-$i-$dev.log"
  args=(test -b "$dev" -j "$JOBS")
  [ -n "${ops:-}" ] && args+=(-o "$ops")
  [ -n "${params:-}" ] && args+=(-p "$params")
  log "test-backend-ops ${args[*]} (log: $out)"
  t0=$SECONDS
  (cd "$BIN" && ./test-backend-ops "${args[@]}") >"$out" 2>&1 || true
  log "$dev: $((SECONDS - t0)) s"
  "$PY" scripts/ggml-judge-table.py "$dev" "$out" || status=1
done

if [ -n "$MODELS" ]; then
  IFS=, read -r -a models <<<"$MODELS"
  for entry in "${models[@]}"; do
    m="${entry%%=*}"
    prompt="The capital of France is"
    [[ $entry == *=* ]] && prompt="$(cat "${entry#*=}")"
    name="$(basename "$m")"
    log "greedy text of $name: ggml's CPU backend (plugin not loaded), then every layer on TesseraCPU"
    gen=(-m "$m" -p "$prompt" -n 16 --temp 0 -no-cnv --no-warmup)
    want="$(cd "$BIN" && GGML_BACKEND_PATH='' ./llama-completion "${gen[@]}" -ngl 0 2>/dev/null)" ||
      die "llama-completion failed on $name"
    got="$(cd "$BIN" && ./llama-completion "${gen[@]}" --device TesseraCPU -ngl 99 \
      2>"$ROOT/target/ggml-judge/completion-$name.log")" ||
      die "llama-completion on TesseraCPU failed on $name (log: target/ggml-judge/completion-$name.log)"
    printf 'ggml CPU:    %s\nTesseraCPU:  %s\n' "${want//$'\n'/ }" "${got//$'\n'/ }"
    if [ "$want" != "$got" ]; then
      log "$name: the greedy texts differ"
      status=1
    fi
    if [ -n "$SPLIT" ]; then
      got="$(cd "$BIN" && ./llama-completion "${gen[@]}" --device TesseraMETA -ngl 99 -t 2 \
        2>"$ROOT/target/ggml-judge/completion-meta-$name.log")" ||
        die "llama-completion on TesseraMETA failed on $name (log: target/ggml-judge/completion-meta-$name.log)"
      printf 'TesseraMETA: %s\n' "${got//$'\n'/ }"
      if [ "$want" != "$got" ]; then
        log "$name: the greedy text on TesseraMETA ($SPLIT) differs"
        status=1
      fi
    fi
    [ "$BENCH" = 1 ] || continue
    log "llama-bench of $name: ggml's CPU backend, then TesseraCPU"
    bench=(-m "$m" -p 64 -n 16 -r 3 -o md)
    (cd "$BIN" && GGML_BACKEND_PATH='' ./llama-bench "${bench[@]}" 2>/dev/null | grep '^|') || status=1
    (cd "$BIN" && ./llama-bench "${bench[@]}" -dev TesseraCPU -ngl 99 2>/dev/null | grep '^|' | tail -n +3) ||
      status=1
    if [ -n "$SPLIT" ]; then
      (cd "$BIN" && ./llama-bench "${bench[@]}" -dev TesseraMETA -ngl 99 2>/dev/null | grep '^|' | tail -n +3) ||
        status=1
    fi
  done
fi
exit "$status"
