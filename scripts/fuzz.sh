#!/usr/bin/env bash
# Runs one coverage-guided fuzz target (cargo fuzz / libFuzzer) for SECONDS, or every target
# with TARGET=all, and prints the executions each reached.
#
#   scripts/fuzz.sh gguf 600                 # ten minutes on the GGUF reader
#   scripts/fuzz.sh all 20                   # every target for 20 s (what CI runs)
#   scripts/fuzz.sh tokenizer 60 -jobs=2     # extra arguments go to libFuzzer
#   FUZZ_SANITIZER=none scripts/fuzz.sh gguf 3600   # no AddressSanitizer: 2-3x the executions
#                                                  # (long campaigns; CI keeps the default)
#   FUZZ_JOBS=2 scripts/fuzz.sh all 8        # two targets at a time (CI: one per core)
#   scripts/fuzz.sh --build-only             # the tools and the sanitizer build, nothing run
#
# Targets: gguf, tokenizer, chat_template, plugin_codec, devices, meta_propagate
# (fuzz/fuzz_targets/). Installs the nightly toolchain (rustup) and cargo-fuzz 0.13.2
# (cargo install --locked) when missing. Seeds come from fuzz/seeds/TARGET (committed); what the
# fuzzer adds goes to fuzz/corpus/TARGET, crashes to fuzz/artifacts/TARGET and the run's log to
# fuzz/logs/TARGET-last-run.log (all ignored by git). A crash exits non-zero; reproduce it with
#   cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/crash-...   (from fuzz/'s parent)
# and add a regression test to the normal test suite before fixing it.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(gguf tokenizer chat_template plugin_codec devices meta_propagate)
target="${1:-}"
seconds="${2:-}"
BUILD_ONLY=0
if [ "$target" = --build-only ]; then
  BUILD_ONLY=1
  seconds=0
fi
if [ -z "$target" ] || [ -z "$seconds" ]; then
  echo "usage: $0 TARGET|all SECONDS [libFuzzer args...]" >&2
  echo "targets: ${TARGETS[*]}" >&2
  exit 2
fi
shift $(($# < 2 ? $# : 2))

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz --version 0.13.2
fi

if [ "$target" = all ]; then
  # FUZZ_SKIP: space-separated targets left out of `all` (CI skips a target whose open finding
  # would fail every run until it is fixed; see docs/src/fuzzing.md).
  list=()
  for t in "${TARGETS[@]}"; do
    case " ${FUZZ_SKIP:-} " in
      *" $t "*) echo "== fuzz $t skipped (FUZZ_SKIP)" ;;
      *) list+=("$t") ;;
    esac
  done
else
  list=("$target")
fi
# Another sanitizer builds into its own directory, so switching does not rebuild the other.
san="${FUZZ_SANITIZER:-address}"
sanitizer=(-s "$san")
if [ "$san" != address ]; then
  sanitizer+=(--target-dir "target/$san")
fi
# One build for all targets (the sanitizer build of the whole crate family takes minutes).
(cd fuzz && cargo +nightly fuzz build "${sanitizer[@]}")
[ "$BUILD_ONLY" = 1 ] && exit 0

# Each target's run writes its summary line to $results/TARGET; FUZZ_JOBS of them run at once
# (each libFuzzer process is one thread).
jobs="${FUZZ_JOBS:-1}"
results="$(mktemp -d)"
trap 'rm -rf "$results"' EXIT
fuzz_one() {
  local t="$1" log result runs cov
  mkdir -p "fuzz/corpus/$t" "fuzz/seeds/$t" "fuzz/artifacts/$t" fuzz/logs
  # Not in artifacts/: cargo-fuzz lists every file there as a failing input after a stopped run.
  log="fuzz/logs/$t-last-run.log"
  echo "== fuzz $t for ${seconds}s"
  # -timeout: an input taking over 10 s is a finding (a hostile file must fail fast);
  # -rss_limit_mb: so must one needing over 2 GiB.
  if (cd fuzz && cargo +nightly fuzz run "${sanitizer[@]}" "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix="artifacts/$t/" -print_final_stats=1 "${extra[@]}") >"$log" 2>&1; then
    result=ok
  else
    result="FAILED (see $log)"
    tail -n 40 "$log" >&2
  fi
  runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' | tail -n 1)"
  cov="$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+')"
  printf '%-16s %12s executions  cov %6s  %s\n' "$t" "${runs:-?}" "${cov:-?}" "$result" >"$results/$t"
}
extra=("$@")
running=0
for t in "${list[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true
status=0
echo "== fuzz summary (${seconds}s per target)"
for t in "${list[@]}"; do
  if [ -f "$results/$t" ]; then
    cat "$results/$t"
    grep -q ' ok$' "$results/$t" || status=1
  else
    printf '%-16s %s\n' "$t" "FAILED (no result)"
    status=1
  fi
done
exit "$status"
