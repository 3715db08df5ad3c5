// Records llama.cpp's tokenizations and chat renderings, the references of Tessera's tokenizer
// tests (tokenizer/src/tests_llama.rs). Built and run by record.sh against a llama.cpp
// build; not part of Tessera's build.
//
// usage: llama_tokenize MODEL.gguf tokens CASES.txt   > ids per case, one line each
//        llama_tokenize MODEL.gguf chat SYSTEM USER   > rendered prompt, "\n__ids__\n", ids
// CASES.txt holds texts separated by "\n__ggml_vocab_test__\n" (llama.cpp's test-tokenizer-0
// format). Cases are tokenized without BOS/EOS and without parsing special tokens, as
// test-tokenizer-0 does. The chat mode renders one user turn (after a system turn when SYSTEM
// is not empty) with llama_chat_apply_template and the model's template, add_ass = true, then
// tokenizes the text with special tokens added and parsed. Only the vocabulary is loaded.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void die(const char * what) {
    std::fprintf(stderr, "error: %s\n", what);
    std::exit(1);
}

static std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text,
                                         bool add_special, bool parse_special) {
    int n = -llama_tokenize(vocab, text.data(), (int) text.size(), nullptr, 0, add_special,
                            parse_special);
    std::vector<llama_token> out(n);
    if (n > 0 && llama_tokenize(vocab, text.data(), (int) text.size(), out.data(), n,
                                add_special, parse_special) != n) {
        die("tokenize");
    }
    return out;
}

static void print_ids(const std::vector<llama_token> & ids) {
    for (llama_token t : ids) std::printf(" %d", t);
    std::printf("\n");
}

int main(int argc, char ** argv) {
    if (argc < 4) die("usage: llama_tokenize MODEL tokens CASES | MODEL chat SYSTEM USER");
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) die("load");
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const std::string mode = argv[2];
    if (mode == "tokens") {
        std::ifstream f(argv[3], std::ios::binary);
        std::stringstream ss;
        ss << f.rdbuf();
        const std::string raw = ss.str();
        const std::string sep = "\n__ggml_vocab_test__\n";
        size_t pos = 0;
        while (pos < raw.size()) {
            size_t next = raw.find(sep, pos);
            std::string text = raw.substr(pos, next == std::string::npos ? std::string::npos : next - pos);
            print_ids(tokenize(vocab, text, false, false));
            if (next == std::string::npos) break;
            pos = next + sep.size();
        }
    } else if (mode == "chat" && argc == 5) {
        const char * tmpl = llama_model_chat_template(model, nullptr);
        if (!tmpl) die("no chat template");
        std::vector<llama_chat_message> msgs;
        if (std::strlen(argv[3]) > 0) msgs.push_back({"system", argv[3]});
        msgs.push_back({"user", argv[4]});
        std::vector<char> buf(1 << 16);
        int n = llama_chat_apply_template(tmpl, msgs.data(), msgs.size(), true, buf.data(), (int) buf.size());
        if (n < 0 || n > (int) buf.size()) die("chat template");
        const std::string text(buf.data(), n);
        std::printf("%s\n__ids__\n", text.c_str());
        print_ids(tokenize(vocab, text, true, true));
    } else {
        die("bad mode");
    }
    llama_model_free(model);
    return 0;
}
