//! The tables, copied from llama.cpp (`src/llama-vocab.cpp`): which `tokenizer.ggml.pre` name
//! selects which pre-tokenizer with which vocabulary quirks, and each pre-tokenizer's regexes
//! (string literals kept byte for byte, since llama.cpp picks its hand-written splitters by
//! comparing these strings).

use super::{PreTokenizer, Quirks};

/// Every `tokenizer.ggml.pre` name llama.cpp accepts for BPE vocabularies, in its order.
pub(super) const NAMES: &[(&str, PreTokenizer, Quirks)] = &[
    ("default", PreTokenizer::Default, Quirks { ..Quirks::NONE }),
    (
        "minicpm5",
        PreTokenizer::Minicpm5,
        Quirks {
            ignore_merges: true,
            ..Quirks::NONE
        },
    ),
    (
        "llama3",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "llama-v3",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "llama-bpe",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "falcon3",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "falcon-h1",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "pixtral",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "midm-2.0",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "lfm2",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "jina-v5-nano",
        PreTokenizer::Llama3,
        Quirks {
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "deepseek-llm",
        PreTokenizer::DeepseekLlm,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "deepseek-coder",
        PreTokenizer::DeepseekCoder,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "deepseek-v3",
        PreTokenizer::Deepseek3Llm,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "spark2_5",
        PreTokenizer::Spark25,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "youtu",
        PreTokenizer::Youtu,
        Quirks {
            clean_spaces: false,
            ignore_merges: true,
            ..Quirks::NONE
        },
    ),
    ("falcon", PreTokenizer::Falcon, Quirks { ..Quirks::NONE }),
    ("mpt", PreTokenizer::Mpt, Quirks { ..Quirks::NONE }),
    (
        "starcoder",
        PreTokenizer::Starcoder,
        Quirks { ..Quirks::NONE },
    ),
    ("gpt-2", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("phi-2", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("jina-es", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("jina-de", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("gigachat", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("jina-v2-es", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("jina-v2-de", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("a.x-4.0", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("mellum", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("modern-bert", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    ("jais-2", PreTokenizer::Jais2, Quirks { ..Quirks::NONE }),
    (
        "gemma4",
        PreTokenizer::Gemma4,
        Quirks {
            escape_whitespaces: true,
            ..Quirks::NONE
        },
    ),
    (
        "granite-embed-multi-311m",
        PreTokenizer::Gemma4,
        Quirks {
            escape_whitespaces: true,
            ..Quirks::NONE
        },
    ),
    (
        "sarvam-moe",
        PreTokenizer::SarvamMoe,
        Quirks {
            escape_whitespaces: true,
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "jina-v1-en",
        PreTokenizer::Gpt2,
        Quirks {
            add_sep: true,
            ..Quirks::NONE
        },
    ),
    (
        "jina-v2-code",
        PreTokenizer::Gpt2,
        Quirks {
            add_sep: true,
            ..Quirks::NONE
        },
    ),
    (
        "roberta-bpe",
        PreTokenizer::Gpt2,
        Quirks {
            add_sep: true,
            ..Quirks::NONE
        },
    ),
    (
        "whitespace",
        PreTokenizer::Whitespace,
        Quirks { ..Quirks::NONE },
    ),
    ("refact", PreTokenizer::Refact, Quirks { ..Quirks::NONE }),
    (
        "command-r",
        PreTokenizer::CommandR,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "qwen2",
        PreTokenizer::Qwen2,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "deepseek-r1-qwen",
        PreTokenizer::Qwen2,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "kormo",
        PreTokenizer::Qwen2,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "f2llmv2",
        PreTokenizer::Qwen2,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "qwen35",
        PreTokenizer::Qwen35,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "stablelm2",
        PreTokenizer::Stablelm2,
        Quirks { ..Quirks::NONE },
    ),
    ("olmo", PreTokenizer::Olmo, Quirks { ..Quirks::NONE }),
    ("dbrx", PreTokenizer::Dbrx, Quirks { ..Quirks::NONE }),
    ("smaug-bpe", PreTokenizer::Smaug, Quirks { ..Quirks::NONE }),
    (
        "poro-chat",
        PreTokenizer::Poro,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "chatglm-bpe",
        PreTokenizer::Chatglm4,
        Quirks {
            no_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "glm4",
        PreTokenizer::Chatglm4,
        Quirks {
            no_bos: true,
            ignore_merges: true,
            ..Quirks::NONE
        },
    ),
    (
        "glm5",
        PreTokenizer::Chatglm4,
        Quirks {
            no_bos: true,
            ignore_merges: true,
            ..Quirks::NONE
        },
    ),
    (
        "viking",
        PreTokenizer::Viking,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    ("jais", PreTokenizer::Jais, Quirks { ..Quirks::NONE }),
    (
        "tekken",
        PreTokenizer::Tekken,
        Quirks {
            clean_spaces: false,
            ignore_merges: true,
            add_bos: true,
            ..Quirks::NONE
        },
    ),
    (
        "smollm",
        PreTokenizer::Smollm,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "codeshell",
        PreTokenizer::Codeshell,
        Quirks { ..Quirks::NONE },
    ),
    ("bloom", PreTokenizer::Bloom, Quirks { ..Quirks::NONE }),
    (
        "gpt3-finnish",
        PreTokenizer::Gpt3Finnish,
        Quirks { ..Quirks::NONE },
    ),
    ("exaone", PreTokenizer::Exaone, Quirks { ..Quirks::NONE }),
    ("exaone4", PreTokenizer::Gpt2, Quirks { ..Quirks::NONE }),
    (
        "exaone-moe",
        PreTokenizer::ExaoneMoe,
        Quirks { ..Quirks::NONE },
    ),
    (
        "chameleon",
        PreTokenizer::Chameleon,
        Quirks {
            add_bos: true,
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "minerva-7b",
        PreTokenizer::Minerva,
        Quirks { ..Quirks::NONE },
    ),
    ("megrez", PreTokenizer::Qwen2, Quirks { ..Quirks::NONE }),
    (
        "gpt-4o",
        PreTokenizer::Gpt4o,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "llama4",
        PreTokenizer::Gpt4o,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "kanana2",
        PreTokenizer::Gpt4o,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "talkie",
        PreTokenizer::Gpt4o,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "granite-embed-multi-97m",
        PreTokenizer::GraniteEmbMulti,
        Quirks {
            clean_spaces: false,
            ignore_merges: true,
            ..Quirks::NONE
        },
    ),
    (
        "tiny_aya",
        PreTokenizer::TinyAya,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "cohere2moe",
        PreTokenizer::TinyAya,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "superbpe",
        PreTokenizer::Superbpe,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "trillion",
        PreTokenizer::Trillion,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "granite-docling",
        PreTokenizer::GraniteDocling,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "bailingmoe",
        PreTokenizer::Bailingmoe,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "bailingmoe2",
        PreTokenizer::Bailingmoe,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "llada-moe",
        PreTokenizer::Bailingmoe,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "seed-coder",
        PreTokenizer::SeedCoder,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "hunyuan",
        PreTokenizer::Hunyuan,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "hunyuan-dense",
        PreTokenizer::HunyuanDense,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "hy_v4",
        PreTokenizer::HyV4,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "joyai-llm",
        PreTokenizer::JoyaiLlm,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "kimi-k2",
        PreTokenizer::KimiK2,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "ufakzeka",
        PreTokenizer::Ufakzeka,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "grok-2",
        PreTokenizer::Grok2,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "afmoe",
        PreTokenizer::Afmoe,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "laguna",
        PreTokenizer::Laguna,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "minimax-m2",
        PreTokenizer::MinimaxM2,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    (
        "solar-open",
        PreTokenizer::SolarOpen,
        Quirks {
            clean_spaces: false,
            ..Quirks::NONE
        },
    ),
    ("mellum2", PreTokenizer::Mellum2, Quirks { ..Quirks::NONE }),
];

impl PreTokenizer {
    /// The split regexes, applied in order (each splits the pieces the previous ones left).
    pub(super) fn regexes(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Llama3 => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Jais2 => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
            ],
            PreTokenizer::Dbrx | PreTokenizer::Smaug => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::DeepseekLlm => &[
                "[\r\n]",
                "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
                "\\s+$",
                "[一-龥ࠀ-一가-퟿]+",
                "\\p{N}+",
            ],
            PreTokenizer::Deepseek3Llm
            | PreTokenizer::HunyuanDense
            | PreTokenizer::JoyaiLlm
            | PreTokenizer::HyV4 => &[
                "\\p{N}{1,3}",
                "[一-龥぀-ゟ゠-ヿ]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Spark25 => &[
                "\\p{N}{1,3}",
                "[一-龥぀-ゟ゠-ヿ]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
                "\\p{N}",
            ],
            PreTokenizer::Youtu => &[
                "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::DeepseekCoder => &[
                "[\r\n]",
                "\\s?\\p{L}+",
                "\\s?\\p{P}+",
                "[一-龥ࠀ-一가-퟿]+",
                "\\p{N}",
            ],
            PreTokenizer::Falcon => &[
                "[\\p{P}\\$\\+<=>\\^~\\|`]+",
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
                "[0-9][0-9][0-9]",
            ],
            PreTokenizer::Starcoder
            | PreTokenizer::Refact
            | PreTokenizer::CommandR
            | PreTokenizer::Smollm
            | PreTokenizer::Codeshell
            | PreTokenizer::Exaone
            | PreTokenizer::Minerva
            | PreTokenizer::Mellum2 => &[
                "\\p{N}",
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            ],
            PreTokenizer::Gpt2
            | PreTokenizer::Mpt
            | PreTokenizer::Olmo
            | PreTokenizer::Jais
            | PreTokenizer::Trillion
            | PreTokenizer::GraniteDocling => {
                &["'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"]
            }
            PreTokenizer::Stablelm2
            | PreTokenizer::Qwen2
            | PreTokenizer::Hunyuan
            | PreTokenizer::SolarOpen => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Qwen35 => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Poro | PreTokenizer::Bloom | PreTokenizer::Gpt3Finnish => {
                &[" ?[^(\\s|.,!?…。，、।۔،)]+"]
            }
            PreTokenizer::Chatglm4 => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Viking => &[" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"],
            PreTokenizer::Tekken => &[
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Chameleon => &[
                "<sentinel:[0-9]+>",
                "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                "([\\t\\n]|    |  )",
                "\\p{N}",
                "[\\p{P}!-/:-@\\[-`{-~]",
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            ],
            PreTokenizer::Gpt4o | PreTokenizer::MinimaxM2 => &[
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::GraniteEmbMulti => &[
                "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::TinyAya => &[
                "\\d{1,3}(?=(?:\\d{3})*\\b)",
                "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::KimiK2 => &["\\p{Han}+"],
            PreTokenizer::Superbpe => &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
            PreTokenizer::Bailingmoe => &[
                "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::SeedCoder => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Ufakzeka => &[
                "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Grok2 => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Afmoe => &[
                "\\p{AFMoE_digits}",
                "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
                "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Laguna => &[
                "[^\\n]+|[\\n]+",
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::ExaoneMoe => &[
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Gemma4 => &["[^\\n]+|[\\n]+"],
            PreTokenizer::SarvamMoe => &["[^\\n]+|[\\n]+"],
            PreTokenizer::Minicpm5 => &[
                "\\p{N}{1,3}",
                "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
            ],
            PreTokenizer::Whitespace => &["\\S+"],
            PreTokenizer::Default => &[
                "[\\p{P}\\$\\+<=>\\^~\\|]+",
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
                "\\p{N}+",
                "[0-9][0-9][0-9]",
            ],
        }
    }
}
