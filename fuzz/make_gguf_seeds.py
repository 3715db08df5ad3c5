#!/usr/bin/env python3
"""Writes the small GGUF seed files of the `gguf` fuzz target into fuzz/seeds/gguf/.

Each is a valid GGUF v3 (or v2) file of a few hundred bytes: typed metadata of every value
type, nested arrays, a SentencePiece or BPE vocabulary, and F32 / F16 / Q8_0 tensors, so the
fuzzer starts from inputs that reach past the header.
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "gguf")
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
       BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def val(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(val(et, i) for i in items)
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors, version=3, align=32):
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += s(k) + struct.pack("<I", t) + val(t, v)
    data, off = b"", 0
    for name, ggml, ne, payload in tensors:
        off = (off + align - 1) // align * align
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", ggml, off)
        data = data.ljust(off, b"\0") + payload
        off += len(payload)
    out = out.ljust((len(out) + align - 1) // align * align, b"\0")
    return out + data


def write(name, blob):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(blob)


os.makedirs(OUT, exist_ok=True)
f32 = lambda n: struct.pack(f"<{n}f", *[0.5] * n)
q8 = struct.pack("<e", 0.25) + bytes(range(32))
write("every_type.gguf", gguf([
    ("a.u8", U8, 7), ("a.i8", I8, -7), ("a.u16", U16, 700), ("a.i16", I16, -700),
    ("a.u32", U32, 70000), ("a.i32", I32, -70000), ("a.f32", F32, 1.5), ("a.bool", BOOL, True),
    ("a.str", STR, "hello"), ("a.u64", U64, 1 << 40), ("a.i64", I64, -(1 << 40)),
    ("a.f64", F64, 2.5), ("a.arr", ARR, (I32, [1, 2, 3])),
    ("a.nested", ARR, (ARR, [(STR, ["x", "y"]), (U8, [1])])),
], [("t.f32", 0, [4, 2], f32(8)), ("t.f16", 1, [4], b"\0<" * 4), ("t.q8", 8, [32], q8)]))
write("v2_aligned64.gguf", gguf([("general.alignment", U32, 64), ("general.name", STR, "s")],
                                [("w", 0, [3], f32(3)), ("v", 0, [1, 1, 2], f32(2))],
                                version=2, align=64))
spm = ["<unk>", "<s>", "</s>", "<0x41>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"]
write("vocab_llama.gguf", gguf([
    ("general.architecture", STR, "llama"), ("llama.block_count", U32, 1),
    ("llama.embedding_length", U32, 32), ("llama.attention.head_count", U32, 2),
    ("llama.feed_forward_length", U32, 64), ("llama.context_length", U32, 16),
    ("tokenizer.ggml.model", STR, "llama"), ("tokenizer.ggml.tokens", ARR, (STR, spm)),
    ("tokenizer.ggml.scores", ARR, (F32, [0.0] * 5 + [-1.0, -2.0, -3.0, -4.0, -5.0])),
    ("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3, 6, 1, 1, 1, 1, 1, 1])),
    ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
    ("tokenizer.chat_template", STR,
     "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"),
], [("token_embd.weight", 0, [4, 10], f32(40))]))
bpe = ["!", "a", "b", "\u0120", "ab", "\u0120a", "<|endoftext|>"]
write("vocab_gpt2.gguf", gguf([
    ("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "llama3"),
    ("tokenizer.ggml.tokens", ARR, (STR, bpe)),
    ("tokenizer.ggml.token_type", ARR, (I32, [1, 1, 1, 1, 1, 1, 3])),
    ("tokenizer.ggml.merges", ARR, (STR, ["a b", "\u0120 a"])),
    ("tokenizer.ggml.eos_token_id", U32, 6), ("tokenizer.ggml.add_bos_token", BOOL, False),
], []))
