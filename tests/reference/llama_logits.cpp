// Records llama.cpp's tokens and logits for a prompt, as the reference of Tessera's real-model
// test (tests/reference/README.md). Built and run by make_gemma3_reference.sh against a llama.cpp
// build; not part of Tessera's build.
//
// usage: llama_logits MODEL.gguf PROMPT TOP_K > reference.txt
// output: "tokens t0 t1 ...", then per position "pos i argmax=ID id:logit id:logit ..." with the
// TOP_K largest logits, then a "greedy" line of 16 greedily generated tokens as id:gap, gap being
// the distance between the chosen logit and the runner-up (small gaps are near-ties).
#include "llama.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

static void die(const char * what) {
    std::fprintf(stderr, "error: %s\n", what);
    std::exit(1);
}

static void decode_one(llama_context * ctx, llama_token tok, int pos) {
    llama_batch b = llama_batch_init(1, 0, 1);
    b.n_tokens = 1;
    b.token[0] = tok;
    b.pos[0] = pos;
    b.n_seq_id[0] = 1;
    b.seq_id[0][0] = 0;
    b.logits[0] = 1;
    if (llama_decode(ctx, b) != 0) die("decode");
    llama_batch_free(b);
}

int main(int argc, char ** argv) {
    if (argc != 4) die("usage: llama_logits MODEL PROMPT TOP_K");
    const int top_k = std::atoi(argv[3]);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("load model");
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::string prompt = argv[2];
    std::vector<llama_token> toks(prompt.size() + 16);
    int n = llama_tokenize(vocab, prompt.c_str(), (int) prompt.size(), toks.data(), (int) toks.size(),
                           /*add_special*/ true, /*parse_special*/ true);
    if (n < 0) die("tokenize");
    toks.resize(n);

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("context");

    llama_batch b = llama_batch_init(n, 0, 1);
    b.n_tokens = n;
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i];
        b.pos[i] = i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    if (llama_decode(ctx, b) != 0) die("decode");

    std::printf("tokens");
    for (int t : toks) std::printf(" %d", t);
    std::printf("\n");
    std::vector<int> idx(n_vocab);
    llama_token last = 0;
    float last_gap = 0.0f;
    for (int i = 0; i < n; i++) {
        const float * l = llama_get_logits_ith(ctx, i);
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                          [&](int a, int c) { return l[a] > l[c]; });
        std::printf("pos %d argmax=%d", i, idx[0]);
        for (int k = 0; k < top_k; k++) std::printf(" %d:%.6f", idx[k], l[idx[k]]);
        std::printf("\n");
        last = idx[0];
        last_gap = l[idx[0]] - l[idx[1]];
    }
    llama_batch_free(b);

    // Greedy continuation, one token at a time.
    std::printf("greedy");
    for (int g = 0; g < 16; g++) {
        std::printf(" %d:%.4f", last, last_gap);
        decode_one(ctx, last, n + g);
        const float * l = llama_get_logits_ith(ctx, -1);
        last = (llama_token) (std::max_element(l, l + n_vocab) - l);
        float second = -INFINITY;
        for (int v = 0; v < n_vocab; v++) {
            if (v != last) second = std::max(second, l[v]);
        }
        last_gap = l[last] - second;
    }
    std::printf("\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
