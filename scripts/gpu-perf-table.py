#!/usr/bin/env python3
"""Reads what scripts/gpu-perf.sh left in OUT (ceilings.json, ops-*.log, model-*.log, peer-*.log,
profile.log), writes OUT/perf.json and OUT/perf.md, and prints the ratio table: each Tessera
figure over the ceiling that the same call measured through torch, and over llama.cpp's CUDA
backend on the same file, next to the issue's target."""
import glob
import json
import os
import re
import sys

QUANT = {"q8_0", "q4_0", "q4_K", "q6_K", "q4_k", "q6_k"}


def table_rows(path):
    rows = []
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("|") and not line.startswith("|-") and not line.startswith("| -"):
                    rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    except OSError:
        pass
    return rows[1:] if rows else []


def md_table(path):
    """The rows of the first markdown table in `path` as dicts keyed by its header."""
    head, rows = None, []
    try:
        with open(path) as f:
            for line in f:
                if not line.startswith("|"):
                    if head and rows:
                        break
                    continue
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if head is None:
                    head = cells
                elif not set(line.strip()) <= set("|-: "):
                    rows.append(dict(zip(head, cells)))
    except OSError:
        pass
    return rows


def num(s):
    m = re.match(r"[-+0-9.eE]+", s)
    return float(m.group(0)) if m else None


def main():
    out = sys.argv[1]
    try:
        ceil = json.load(open(os.path.join(out, "ceilings.json")))
    except (OSError, ValueError):
        ceil = {}
    copy = ceil.get("copy_bytes_per_s")
    mm = ceil.get("bf16_gemm_n512_flops")
    mm_big = ceil.get("bf16_gemm_8192_flops")
    sdpa = ceil.get("sdpa_causal_2048_ms")
    res = []
    # The GEMM shape of the ceilings (gpu-perf.sh's M x K), and Tessera's GEMM figures by
    # (type, m, n, k, device) for the comparison with llama.cpp's own.
    main_shape = f"{ceil.get('gemm_m', 14336)}x{ceil.get('gemm_k', 4096)}"
    ours_gemm = {}

    def add(what, dev, value, unit, ceiling, ratio, target):
        res.append({"what": what, "device": dev, "value": value, "unit": unit,
                    "ceiling": ceiling, "ratio": ratio, "target": target})

    for log in sorted(glob.glob(os.path.join(out, "ops-*.log"))):
        for r in table_rows(log):
            if len(r) < 8 or r[3].startswith("error"):
                if len(r) >= 4:
                    add(r[0], r[1], None, "error", None, None, None)
                continue
            label, dev = r[0], r[1]
            variant = re.search(r"ops-(?:gv-(.+)|overhead-(norep)|(mma-off|gemv8-off|gemv8-unroll4))\.log$", log)
            if variant:
                dev = f"{dev} {variant.group(1) or variant.group(3) or 'no replay'}"
            us, us_node, gflops, gbs = num(r[4]), num(r[5]), num(r[6]), num(r[7])
            vk = dev.startswith("VK")
            m = re.match(r"MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=(\d+),k=(\d+)\)", label)
            if m:
                t, n = m.group(1), int(m.group(3))
                shape = f"{m.group(2)}x{m.group(4)}"
                if n == 1:
                    ratio = gbs * 1e9 / copy if copy else None
                    add(f"GEMV {t} {shape}", dev, gbs, "GB/s",
                        copy and copy / 1e9, ratio, 0.4 if vk else 0.6)
                else:
                    ours_gemm[(t, int(m.group(2)), n, int(m.group(4)), dev)] = gflops
                    # Against torch's bf16 product on the same shape (the ceilings' shape only).
                    torch_mm = ceil.get(f"bf16_gemm_n{n}_flops") if shape == main_shape else None
                    ratio = gflops * 1e9 / torch_mm if torch_mm else None
                    target = None if t in QUANT else (0.8 if n == 512 and not vk else None)
                    add(f"GEMM {t} {shape} n={n}", dev, gflops / 1e3, "TFLOP/s",
                        torch_mm and torch_mm / 1e12, ratio, target)
            elif label.startswith("FLASH_ATTN_EXT") and "nb=2048" in label and "mask=causal" in label:
                add("attention 2048 causal (ms)", dev, us / 1e3, "ms", sdpa,
                    sdpa / (us / 1e3) if sdpa else None, 0.5)
            elif label.startswith("FLASH_ATTN_EXT"):
                add(label.split("(")[1].rstrip(")"), dev, gflops / 1e3, "TFLOP/s", None, None, None)
            elif label.startswith("OVERHEAD"):
                target = 20.0 if vk else 5.0
                add("per-node cost (OVERHEAD)", dev, us_node, "us/node", target, target / us_node, 1.0)
            elif label.startswith("RMS_NORM"):
                add("RMS_NORM 4096x512", dev, gbs, "GB/s", copy and copy / 1e9,
                    gbs * 1e9 / copy if copy else None, None)
    tg = {}
    for log in sorted(glob.glob(os.path.join(out, "model-*.log"))):
        for r in table_rows(log):
            if len(r) < 8 or not r[6].startswith(("pp", "tg")):
                continue
            model, size, params, dev, split, test = r[0], num(r[1]), num(r[2]), r[4], r[5], r[6]
            speed = num(r[7])
            if speed is None:
                continue
            wtype = model.split()[-1]
            if test.startswith("tg"):
                roof = copy / (size * 2**20) if copy and size else None
                tg[(wtype, dev, split)] = speed
                add(f"{model.replace('synthetic-llama ', '')} {test} {split}", dev, speed, "t/s", roof,
                    speed / roof if roof else None, 0.5)
            else:
                flops = 2 * params * 1e6 * speed
                add(f"{model.replace('synthetic-llama ', '')} {test} {split}", dev, speed, "t/s", mm_big and mm_big / 1e12,
                    flops / mm_big if mm_big else None, 0.25)
    for (w, dev, split), v in list(tg.items()):
        if split.startswith("tensor"):
            base = next((b for (w2, d2, s2), b in tg.items() if w2 == w and s2 == "none"), None)
            if base:
                add(f"meta device: tensor / none tg {w}", dev, v, "t/s", base, v / base, 0.8)
        if dev.startswith("VK") and split == "none":
            cuda = tg.get((w, "CUDA0", "none"))
            if cuda:
                add(f"Vulkan / CUDA tg {w}", dev, v, "t/s", cuda, v / cuda, 0.5)

    # Tessera against llama.cpp's CUDA backend on the same file, test by test.
    for log in sorted(glob.glob(os.path.join(out, "peer-*.log"))):
        name = re.search(r"peer-(.+)\.log$", log).group(1)
        if name == "ops":
            continue
        ours = {r.get("test"): num(r.get("t/s", "")) for r in md_table(os.path.join(out, f"model-{name}.log"))
                if r.get("split mode", "none") == "none"}
        for r in md_table(log):
            test, theirs = r.get("test"), num(r.get("t/s", ""))
            if not test or theirs is None:
                continue
            mine = ours.get(test)
            add(f"{name} {test}: Tessera / llama.cpp CUDA", "CUDA0", mine, "t/s", theirs,
                mine / theirs if mine and theirs else None, 1.0)
    # Recorded programs (CUDA graph replay) against launching every node.
    for log in sorted(glob.glob(os.path.join(out, "norep-*.log"))):
        name = re.search(r"norep-(.+)\.log$", log).group(1)
        ours = {r.get("test"): num(r.get("t/s", "")) for r in md_table(os.path.join(out, f"model-{name}.log"))}
        for r in md_table(log):
            test, plain = r.get("test"), num(r.get("t/s", ""))
            mine = ours.get(test)
            if test and plain:
                add(f"{name} {test}: replay / launch each node", "CUDA0", mine, "t/s", plain,
                    mine / plain if mine else None, None)
    # llama.cpp's own op figures (test-backend-ops perf), for the GEMV and GEMM rows above.
    try:
        with open(os.path.join(out, "peer-ops.log")) as f:
            for line in f:
                m = re.match(r"\s*(MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=(\d+),k=(\d+)[^)]*\)).*?"
                             r"([0-9.]+) (GFLOPS|TFLOPS)", line)
                if m:
                    v = float(m.group(6)) * (1e3 if m.group(7) == "TFLOPS" else 1)
                    t, mm_, n, k = m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))
                    add(f"llama.cpp {t} m={mm_} n={n} k={k}", "CUDA0 (llama.cpp)", v / 1e3, "TFLOP/s",
                        None, None, None)
                    # Tessera on the same shape and type (ops-cuda-peer-shape), as a ratio.
                    mine = ours_gemm.get((t, mm_, n, k, "CUDA0"))
                    if mine is not None and n > 1:
                        add(f"GEMM {t} m={mm_} n={n} k={k}: Tessera / llama.cpp", "CUDA0", mine / 1e3,
                            "TFLOP/s", v / 1e3, mine / v if v else None,
                            1.0 if t in QUANT and n == 512 else None)
    except OSError:
        pass

    def fmt(x, p=3):
        return "-" if x is None else (f"{x:.{p}g}" if isinstance(x, float) else str(x))

    lines = [f"GPU: {ceil.get('gpu', '?')}; torch {ceil.get('torch', '?')}; ceilings: copy "
             f"{fmt(copy and copy / 1e9)} GB/s (read+write), bf16 GEMM n=512 "
             f"{fmt(mm and mm / 1e12)} TFLOP/s, 8192^3 {fmt(mm_big and mm_big / 1e12)} TFLOP/s, "
             f"bf16 GEMV {fmt(ceil.get('bf16_gemv_bytes_per_s', 0) / 1e9)} GB/s, SDPA causal "
             f"2048 {fmt(sdpa)} ms",
             "",
             "| what | device | value | unit | ceiling | ratio | target | met |",
             "|---|---|---|---|---|---|---|---|"]
    for x in res:
        met = "-" if x["ratio"] is None or x["target"] is None else (
            "yes" if x["ratio"] >= x["target"] else "no")
        lines.append(f"| {x['what']} | {x['device']} | {fmt(x['value'], 4)} | {x['unit']} | "
                     f"{fmt(x['ceiling'], 4)} | {fmt(x['ratio'])} | {fmt(x['target'])} | {met} |")
    try:
        with open(os.path.join(out, "profile.log")) as f:
            text = f.read()
        at = text.find("GPU profile")
        prof = [] if at < 0 else [l for l in text[at:].splitlines()
                                  if l.startswith(("GPU profile", "host per", "device per", "|"))]
        if prof:
            lines += ["", "Decode profile (TESSERA_GPU_PROFILE, 1.1B Q4_0):", ""] + prof[:40]
    except OSError:
        pass
    text = "\n".join(lines)
    with open(os.path.join(out, "perf.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "perf.json"), "w") as f:
        json.dump({"ceilings": ceil, "results": res}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
