// Records llama.cpp's logits for Tessera's reference suite (tests/reference/README.md): every
// prompt position and a greedy continuation, computed with flash attention on, plus how far
// llama.cpp's own flash-attention-off run is from it (the tolerance quantized models are held
// to). Built and run by make_references.sh against a llama.cpp build; not part of Tessera's build.
//
// usage: llama_reference MODEL.gguf (--tokens ID,ID,... | --prompt TEXT) TOP_K N_GREEDY [CTK CTV]
//        llama_reference MODEL.gguf --batch ID,ID,... N_SEQ N_STEPS
//   --batch: N_SEQ sequences in one unified cache, sequence s the 3+s ids from id s of the list
//   (wrapping). One batch holds every prompt (every position's logits), then N_STEPS batches hold
//   one greedy token per sequence. Whole rows; see "batch output" below.
//   TOP_K = 0 writes whole rows (small vocabularies); otherwise the TOP_K largest logits and the
//   row's sum and sum of squares.
//   CTK CTV: KV cache types by llama.cpp's names (default f16 f16). With another pair the rows and
//   the greedy tokens are those of the pair (flash attention on), fa_nmse / top_nmse are the F16
//   cache's flash-attention on/off spread on the same tokens, and kv_nmse is the pair's own
//   effect: the NMSE of the pair's logits against the F16 cache's, over the ids written.
// output:
//   tokens ID ...                          prompt ids (BOS and specials as llama.cpp adds them)
//   row I fa_nmse=X [kv_nmse=Z] [top_nmse=Y sum=S sumsq=Q] V ... | ID:V ...
//       one per position: the prompt's, then one per greedy token fed back; fa_nmse is the NMSE
//       of the flash-attention-off logits against these, top_nmse the same over the top-K ids
//   greedy ID:GAP ...                      greedy tokens, GAP = lead over the runner-up
// batch output:
//   prompt S ID ...                        sequence S's prompt
//   feed S P ID                            the token sequence S is fed at position P (greedy)
//   row S P fa_nmse=X solo_nmse=Y V ...    logits of sequence S at position P in the batch; fa_nmse
//       is the flash-attention-off batch against it, solo_nmse the sequence run alone (flash on)
#include "ggml-backend.h"
#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

static void die(const char * what) {
    std::fprintf(stderr, "error: %s\n", what);
    std::exit(1);
}

static ggml_type cache_type(const char * name) {
    const ggml_type types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q8_0,  GGML_TYPE_Q4_0,
                               GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_IQ4_NL};
    for (ggml_type t : types) {
        if (std::strcmp(ggml_type_name(t), name) == 0) return t;
    }
    die("unknown cache type");
    return GGML_TYPE_F16;
}

static llama_context * make_ctx(llama_model * model, bool flash, ggml_type ctk = GGML_TYPE_F16,
                                ggml_type ctv = GGML_TYPE_F16, int n_seq = 1) {
    llama_context_params cp = llama_context_default_params();
    cp.n_seq_max = n_seq;
    cp.kv_unified = true;
    cp.type_k = ctk;
    cp.type_v = ctv;
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("context");
    return ctx;
}

// One batch of (token, position, sequence) with every token's logits, n_vocab per token.
struct Tok {
    llama_token id;
    int pos;
    int seq;
};

static std::vector<float> eval_batch(llama_context * ctx, const std::vector<Tok> & toks, int n_vocab) {
    const int n = (int) toks.size();
    llama_batch b = llama_batch_init(n, 0, 1);
    b.n_tokens = n;
    for (int i = 0; i < n; i++) {
        b.token[i] = toks[i].id;
        b.pos[i] = toks[i].pos;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = toks[i].seq;
        b.logits[i] = 1;
    }
    if (llama_decode(ctx, b) != 0) die("decode");
    std::vector<float> out((size_t) n * n_vocab);
    for (int i = 0; i < n; i++) {
        std::memcpy(&out[(size_t) i * n_vocab], llama_get_logits_ith(ctx, i), sizeof(float) * n_vocab);
    }
    llama_batch_free(b);
    return out;
}

// Feeds `toks` at positions `pos0..` of sequence 0 and returns the logits of each.
static std::vector<float> eval(llama_context * ctx, const std::vector<llama_token> & toks, int pos0,
                               int n_vocab) {
    std::vector<Tok> b;
    for (size_t i = 0; i < toks.size(); i++) b.push_back({toks[i], pos0 + (int) i, 0});
    return eval_batch(ctx, b, n_vocab);
}

static double nmse(const float * a, const float * ref, const std::vector<int> & ids);

// The --batch mode (see the usage above).
static int record_batch(llama_model * model, const std::vector<llama_token> & base, int n_seq, int n_steps) {
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<int> all(n_vocab);
    std::iota(all.begin(), all.end(), 0);
    std::vector<std::vector<llama_token>> prompts(n_seq);
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < 3 + s; i++) prompts[s].push_back(base[(s + i) % base.size()]);
        std::printf("prompt %d", s);
        for (llama_token t : prompts[s]) std::printf(" %d", t);
        std::printf("\n");
    }
    llama_context * on = make_ctx(model, true, GGML_TYPE_F16, GGML_TYPE_F16, n_seq);
    llama_context * off = make_ctx(model, false, GGML_TYPE_F16, GGML_TYPE_F16, n_seq);
    // Each sequence alone: its own context, fed the same tokens.
    std::vector<llama_context *> solo(n_seq);
    std::vector<std::vector<float>> solo_rows(n_seq);
    for (int s = 0; s < n_seq; s++) {
        solo[s] = make_ctx(model, true);
        solo_rows[s] = eval(solo[s], prompts[s], 0, n_vocab);
    }
    std::vector<Tok> batch;
    for (int s = 0; s < n_seq; s++) {
        for (int i = 0; i < (int) prompts[s].size(); i++) batch.push_back({prompts[s][i], i, s});
    }
    for (int step = 0; step <= n_steps; step++) {
        std::vector<float> a = eval_batch(on, batch, n_vocab);
        std::vector<float> b = eval_batch(off, batch, n_vocab);
        std::vector<Tok> next;
        for (size_t i = 0; i < batch.size(); i++) {
            const Tok & t = batch[i];
            const float * l = &a[i * n_vocab];
            const float * solo_row = &solo_rows[t.seq][(size_t) t.pos * n_vocab];
            std::printf("row %d %d fa_nmse=%.3e solo_nmse=%.3e", t.seq, t.pos, nmse(&b[i * n_vocab], l, all),
                        nmse(solo_row, l, all));
            for (int v = 0; v < n_vocab; v++) std::printf(" %.7g", l[v]);
            std::printf("\n");
            const bool last = i + 1 == batch.size() || batch[i + 1].seq != t.seq;
            if (last && step < n_steps) {
                llama_token best = (llama_token) (std::max_element(l, l + n_vocab) - l);
                next.push_back({best, t.pos + 1, t.seq});
            }
        }
        for (const Tok & t : next) {
            std::printf("feed %d %d %d\n", t.seq, t.pos, t.id);
            std::vector<float> r = eval(solo[t.seq], {t.id}, t.pos, n_vocab);
            solo_rows[t.seq].insert(solo_rows[t.seq].end(), r.begin(), r.end());
        }
        batch = next;
    }
    for (llama_context * c : solo) llama_free(c);
    llama_free(on);
    llama_free(off);
    return 0;
}

static double nmse(const float * a, const float * ref, const std::vector<int> & ids) {
    double err = 0, norm = 0;
    for (int v : ids) {
        err += (double(a[v]) - ref[v]) * (double(a[v]) - ref[v]);
        norm += double(ref[v]) * ref[v];
    }
    return err == 0 ? 0 : err / norm;
}

static std::vector<llama_token> parse_ids(const std::string & s) {
    std::vector<llama_token> out;
    size_t at = 0;
    while (at < s.size()) {
        size_t end = s.find(',', at);
        if (end == std::string::npos) end = s.size();
        out.push_back(std::atoi(s.substr(at, end - at).c_str()));
        at = end + 1;
    }
    return out;
}

int main(int argc, char ** argv) {
    if (argc == 6 && std::strcmp(argv[2], "--batch") == 0) {
        ggml_backend_load_all();
        llama_backend_init();
        llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
        if (!model) die("load model");
        std::vector<llama_token> base = parse_ids(argv[3]);
        if (base.empty()) die("no ids");
        const int r = record_batch(model, base, std::atoi(argv[4]), std::atoi(argv[5]));
        llama_model_free(model);
        return r;
    }
    if (argc != 6 && argc != 8) {
        die("usage: llama_reference MODEL (--tokens IDS | --prompt TEXT) TOP_K N_GREEDY [CTK CTV]");
    }
    const int top_k = std::atoi(argv[4]);
    const int n_greedy = std::atoi(argv[5]);
    const ggml_type ctk = argc == 8 ? cache_type(argv[6]) : GGML_TYPE_F16;
    const ggml_type ctv = argc == 8 ? cache_type(argv[7]) : GGML_TYPE_F16;
    const bool typed = ctk != GGML_TYPE_F16 || ctv != GGML_TYPE_F16;
    // A build with loadable backends (GGML_BACKEND_DL) has none until they are loaded.
    ggml_backend_load_all();
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("load model");
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> prompt;
    if (std::strcmp(argv[2], "--tokens") == 0) {
        prompt = parse_ids(argv[3]);
    } else {
        std::string text = argv[3];
        prompt.resize(text.size() + 16);
        int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), prompt.data(), (int) prompt.size(),
                               /*add_special*/ true, /*parse_special*/ true);
        if (n < 0) die("tokenize");
        prompt.resize(n);
    }

    // `on` gives the recorded rows and greedy tokens; `f16`/`off` are the F16 cache with flash
    // attention on/off, fed the same tokens (with F16 caches `on` is itself the F16 run).
    llama_context * on = make_ctx(model, true, ctk, ctv);
    llama_context * off = make_ctx(model, false);
    llama_context * f16 = typed ? make_ctx(model, true) : nullptr;
    const int n = (int) prompt.size();
    std::vector<float> rows_on = eval(on, prompt, 0, n_vocab);
    std::vector<float> rows_off = eval(off, prompt, 0, n_vocab);
    std::vector<float> rows_f16 = typed ? eval(f16, prompt, 0, n_vocab) : std::vector<float>();
    std::vector<llama_token> greedy;
    std::vector<float> gaps;
    for (int g = 0; g < n_greedy; g++) {
        const float * l = &rows_on[rows_on.size() - n_vocab];
        llama_token best = (llama_token) (std::max_element(l, l + n_vocab) - l);
        float second = -INFINITY;
        for (int v = 0; v < n_vocab; v++) {
            if (v != best) second = std::max(second, l[v]);
        }
        greedy.push_back(best);
        gaps.push_back(l[best] - second);
        std::vector<float> a = eval(on, {best}, n + g, n_vocab);
        std::vector<float> b = eval(off, {best}, n + g, n_vocab);
        rows_on.insert(rows_on.end(), a.begin(), a.end());
        rows_off.insert(rows_off.end(), b.begin(), b.end());
        if (typed) {
            std::vector<float> c = eval(f16, {best}, n + g, n_vocab);
            rows_f16.insert(rows_f16.end(), c.begin(), c.end());
        }
    }

    std::printf("tokens");
    for (int t : prompt) std::printf(" %d", t);
    std::printf("\n");
    std::vector<int> all(n_vocab);
    std::iota(all.begin(), all.end(), 0);
    const int n_rows = (int) (rows_on.size() / n_vocab);
    for (int i = 0; i < n_rows; i++) {
        const float * l = &rows_on[(size_t) i * n_vocab];
        const float * o = &rows_off[(size_t) i * n_vocab];
        const float * h = typed ? &rows_f16[(size_t) i * n_vocab] : l;
        std::printf("row %d fa_nmse=%.3e", i, nmse(o, h, all));
        if (top_k == 0) {
            if (typed) std::printf(" kv_nmse=%.3e", nmse(l, h, all));
            for (int v = 0; v < n_vocab; v++) std::printf(" %.7g", l[v]);
        } else {
            std::vector<int> idx = all;
            std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(),
                              [&](int a, int c) { return l[a] > l[c]; });
            idx.resize(top_k);
            double sum = 0, sumsq = 0;
            for (int v = 0; v < n_vocab; v++) {
                sum += l[v];
                sumsq += double(l[v]) * l[v];
            }
            if (typed) std::printf(" kv_nmse=%.3e", nmse(l, h, idx));
            std::printf(" top_nmse=%.3e sum=%.6e sumsq=%.6e", nmse(o, h, idx), sum, sumsq);
            for (int v : idx) std::printf(" %d:%.7g", v, l[v]);
        }
        std::printf("\n");
    }
    std::printf("greedy");
    for (size_t g = 0; g < greedy.size(); g++) std::printf(" %d:%.4f", greedy[g], gaps[g]);
    std::printf("\n");
    llama_free(on);
    llama_free(off);
    if (f16) llama_free(f16);
    llama_model_free(model);
    return 0;
}
