#!/usr/bin/env bash
# Records llama.cpp's references for Tessera's tokenizer tests (tokenizer/src/tests_llama.rs):
# the ids of texts.txt for every vocab-only GGUF of llama.cpp's models/ directory and for the
# SmolLM2 and Gemma 3 files, and SmolLM2's chat renderings.
#
# usage: record.sh LLAMA_CPP_DIR (built, with build/bin/libllama.so) SMOLLM2.gguf GEMMA3.gguf
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
llama="$1"; smol="$2"; gemma="$3"
bin="$(mktemp -d)/llama_tokenize"
g++ -O1 -std=c++17 -I "$llama/include" -I "$llama/ggml/include" "$here/llama_tokenize.cpp" \
  -L "$llama/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$llama/build/bin" -o "$bin"
for f in "$llama"/models/ggml-vocab-*.gguf; do
  name="$(basename "$f" .gguf)"
  if "$bin" "$f" tokens "$here/texts.txt" > "$here/$name.out" 2>/dev/null; then
    echo "$name: $(wc -l < "$here/$name.out") cases"
  else
    rm -f "$here/$name.out"; echo "$name: llama.cpp cannot load it"
  fi
done
"$bin" "$smol" tokens "$here/texts.txt" > "$here/smollm2.out" 2>/dev/null
"$bin" "$gemma" tokens "$here/texts.txt" > "$here/gemma3.out" 2>/dev/null
q="What is the capital of France?"
"$bin" "$smol" chat "" "$q" > "$here/smollm2_chat.txt" 2>/dev/null
"$bin" "$smol" chat "You are terse." "$q" > "$here/smollm2_chat_system.txt" 2>/dev/null
