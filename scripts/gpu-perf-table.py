#!/usr/bin/env python3
"""The ratio table of a scripts/gpu-perf.sh run, and a check that nothing in it went missing.

Reads what gpu-perf.sh left in LOGS: steps.tsv (each step's name, exit status, seconds and
limit), ceilings.json, conformance-*.log, reference.log, ops-*.log, model-*.log, norep-*.log,
fa-chunk-*.log, peer-*.log and profile.log. Every markdown table is read by its header, never by
column position. Writes LOGS/perf.json and LOGS/perf.md and prints the table: each Tessera figure
over the ceiling that the same call measured through torch, and over llama.cpp's CUDA backend on
the same file, next to the issue's target.

Nothing is left out quietly. A step that ran and exited 0 must give its rows; every row of every
table must be read; the ratios that pair two steps (Tessera / llama.cpp, replay / launch, tensor
/ none, Vulkan / CUDA) must find both sides. What is not is listed under "Problems" at the top of
perf.md; with --strict (CI's check on the CPU device) any problem makes the exit status 1.

Usage: gpu-perf-table.py LOGS [--strict] [--device CUDA0] [--vk-device VK0]
"""
import argparse
import glob
import json
import os
import re
import sys

QUANT = {"q8_0", "q4_0", "q4_K", "q6_K", "q4_k", "q6_k", "q5_0", "q4_1", "q5_K", "q5_k"}
# The keys gpu-ceilings.py writes that the ratios divide by.
CEILING_KEYS = ("copy_bytes_per_s", "bf16_gemm_n512_flops", "bf16_gemm_8192_flops", "sdpa_causal_2048_ms")


def md_tables(path):
    """Every markdown table in `path`: a list of (header, rows), each row a dict keyed by the
    header's names, plus "_cells" (the raw cells) and "_line" (the text). A row with fewer cells
    than the header (bench-ops' `error:` rows) keeps what it has."""
    tables = []
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return tables
    head = None
    for i, line in enumerate(lines):
        s = line.strip()
        if not s.startswith("|"):
            head = None
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if set(s) <= set("|-: "):
            continue
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if head is None and nxt.startswith("|") and set(nxt) <= set("|-: "):
            head = cells
            tables.append((head, []))
            continue
        if head is None:
            continue
        row = dict(zip(head, cells))
        row["_cells"] = cells
        row["_line"] = s
        tables[-1][1].append(row)
    return tables


def table_rows(path):
    return [r for _, rows in md_tables(path) for r in rows]


def num(s):
    m = re.match(r"\s*[-+]?[0-9.]+(?:[eE][-+]?[0-9]+)?", s or "")
    try:
        return float(m.group(0)) if m else None
    except ValueError:
        return None


def read_steps(logs):
    """steps.tsv as {name: (rc, seconds)} in the order run; without it (a run from before the
    file existed), every log present counts as a step that exited 0."""
    steps = {}
    try:
        for line in open(os.path.join(logs, "steps.tsv")):
            f = line.rstrip("\n").split("\t")
            if len(f) >= 3 and f[1].lstrip("-").isdigit():
                steps[f[0]] = (int(f[1]), int(f[2]) if f[2].isdigit() else None)
    except OSError:
        for log in sorted(glob.glob(os.path.join(logs, "*.log"))):
            steps[os.path.basename(log)[:-4]] = (0, None)
    return steps


class Table:
    def __init__(self, logs, device, vk_device):
        self.logs, self.device, self.vk = logs, device, vk_device
        self.res = []
        self.problems = []
        self.steps = read_steps(logs)

    def ok(self, step):
        return self.steps.get(step, (None,))[0] == 0

    def path(self, step):
        return os.path.join(self.logs, f"{step}.log")

    def add(self, src, what, dev, value, unit, ceiling, ratio, target):
        self.res.append({"what": what, "device": dev, "value": value, "unit": unit,
                         "ceiling": ceiling, "ratio": ratio, "target": target, "step": src})

    def problem(self, text):
        self.problems.append(text)

    # --- the run's own outcome -------------------------------------------------------------
    def check_steps(self):
        for name, (rc, secs) in self.steps.items():
            if rc == 125:
                continue
            if rc != 0:
                why = "timed out" if rc in (124, 137) else f"exit {rc}"
                tail = ""
                try:
                    text = [l for l in open(self.path(name), errors="replace").read().splitlines() if l.strip()]
                    tail = f": {text[-1][:160]}" if text else ""
                except OSError:
                    pass
                self.problem(f"step {name} {why} after {secs} s{tail}")

    def conformance(self):
        """libtest's summary of each per-op conformance process and of the reference suite."""
        for log in sorted(glob.glob(os.path.join(self.logs, "conformance-*.log"))) + [self.path("reference")]:
            step = os.path.basename(log)[:-4]
            if step not in self.steps:
                continue
            try:
                text = open(log, errors="replace").read()
            except OSError:
                continue
            m = None
            for m in re.finditer(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored", text):
                pass
            if not m:
                if self.ok(step):
                    self.problem(f"{step}.log: no libtest summary line")
                elif self.steps[step][0] != 125:
                    self.add(step, f"{step}: crashed or timed out", self.device, None, "cases", None, None, None)
                continue
            passed, failed, ignored = int(m.group(2)), int(m.group(3)), int(m.group(4))
            self.add(step, f"{step}: cases passed of those run ({ignored} ignored)", self.device, passed, "cases",
                     passed + failed, passed / (passed + failed) if passed + failed else None, 1.0)

    # --- ceilings ----------------------------------------------------------------------------
    def ceilings(self):
        try:
            self.ceil = json.load(open(os.path.join(self.logs, "ceilings.json")))
        except (OSError, ValueError):
            self.ceil = {}
        if self.ok("ceilings"):
            for k in CEILING_KEYS:
                if not isinstance(self.ceil.get(k), (int, float)):
                    self.problem(f"ceilings.json: no {k}")

    # --- bench-ops ---------------------------------------------------------------------------
    def ops(self):
        ceil = self.ceil
        copy = ceil.get("copy_bytes_per_s")
        sdpa = ceil.get("sdpa_causal_2048_ms")
        main_shape = f"{ceil.get('gemm_m', 14336)}x{ceil.get('gemm_k', 4096)}"
        self.ours_gemm = {}
        for log in sorted(glob.glob(os.path.join(self.logs, "ops-*.log"))):
            step = os.path.basename(log)[:-4]
            variant = re.match(r"ops-(?:overhead-(norep)|(mma-off|gemv8-off|gemv8-unroll4))$", step)
            read = 0
            for r in table_rows(log):
                label, dev = r.get("case", ""), r.get("device", "?")
                if variant:
                    dev = f"{dev} {variant.group(2) or 'no replay'}"
                if any(c.startswith("error") for c in r["_cells"]):
                    err = next(c for c in r["_cells"] if c.startswith("error"))
                    self.add(step, label, dev, None, "error", None, None, None)
                    self.problem(f"{step}.log: {label} on {dev}: {err[:160]}")
                    read += 1
                    continue
                us, us_node = num(r.get("us/run")), num(r.get("us/node"))
                gflops, gbs = num(r.get("GFLOP/s")), num(r.get("GB/s"))
                if us is None or gflops is None or gbs is None:
                    self.problem(f"{step}.log: row without us/run, GFLOP/s or GB/s: {r['_line'][:160]}")
                    continue
                vk = dev.startswith("VK")
                m = re.match(r"MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=(\d+),k=(\d+)", label)
                if m:
                    t, n = m.group(1), int(m.group(3))
                    shape = f"{m.group(2)}x{m.group(4)}"
                    if n == 1:
                        target = 0.4 if vk else (0.7 if t in QUANT else 0.85)
                        self.add(step, f"GEMV {t} {shape}", dev, gbs, "GB/s", copy and copy / 1e9,
                                 gbs * 1e9 / copy if copy else None, target)
                    else:
                        self.ours_gemm[(t, int(m.group(2)), n, int(m.group(4)), dev)] = gflops
                        # Against torch's bf16 product on the same shape (the ceilings' only).
                        torch_mm = ceil.get(f"bf16_gemm_n{n}_flops") if shape == main_shape else None
                        target = None if t in QUANT else (0.8 if n == 512 and not vk else None)
                        self.add(step, f"GEMM {t} {shape} n={n}", dev, gflops / 1e3, "TFLOP/s",
                                 torch_mm and torch_mm / 1e12,
                                 gflops * 1e9 / torch_mm if torch_mm else None, target)
                elif label.startswith("FLASH_ATTN_EXT") and "nb=2048" in label and "mask=causal" in label:
                    self.add(step, "attention 2048 causal (ms)", dev, us / 1e3, "ms", sdpa,
                             sdpa / (us / 1e3) if sdpa and us else None, 0.5)
                elif label.startswith("FLASH_ATTN_EXT"):
                    self.add(step, label.split("(", 1)[-1].rstrip(")"), dev, gflops / 1e3, "TFLOP/s",
                             None, None, None)
                elif label.startswith("OVERHEAD"):
                    target = 20.0 if vk else 2.0
                    self.add(step, "per-node cost (OVERHEAD)", dev, us_node, "us/node", target,
                             target / us_node if us_node else None, 1.0)
                elif label.startswith("RMS_NORM"):
                    self.add(step, label, dev, gbs, "GB/s", copy and copy / 1e9,
                             gbs * 1e9 / copy if copy else None, None)
                else:
                    self.add(step, label, dev, gflops / 1e3, "TFLOP/s", None, None, None)
                read += 1
            if self.ok(step) and read == 0:
                self.problem(f"{step}.log: the step exited 0 but no bench-ops row was read")

    # --- tessera bench -----------------------------------------------------------------------
    def bench_rows(self, step):
        """(model, device, split, test) -> t/s of a `tessera bench` log, read by header."""
        out = {}
        for head, rows in md_tables(self.path(step)):
            missing = [h for h in ("model", "size", "params", "devices", "split mode", "test", "t/s") if h not in head]
            if missing:
                self.problem(f"{step}.log: a table without the column(s) {', '.join(missing)}: {head}")
                continue
            for r in rows:
                speed = num(r.get("t/s"))
                if speed is None or not re.match(r"(pp|tg)\d+", r.get("test", "")):
                    self.problem(f"{step}.log: row not read: {r['_line'][:160]}")
                    continue
                out[(r["model"], r["devices"], r["split mode"], r["test"])] = (speed, r)
        if self.ok(step) and not out:
            self.problem(f"{step}.log: the step exited 0 but no pp/tg row was read")
        return out

    def models(self):
        copy = self.ceil.get("copy_bytes_per_s")
        mm_big = self.ceil.get("bf16_gemm_8192_flops")
        self.tg = {}
        self.model_rows = {}
        for log in sorted(glob.glob(os.path.join(self.logs, "model-*.log"))):
            step = os.path.basename(log)[:-4]
            rows = self.bench_rows(step)
            self.model_rows[step] = rows
            for (model, dev, split, test), (speed, r) in rows.items():
                size, params = num(r.get("size")), num(r.get("params"))
                wtype = model.split()[-1]
                what = f"{model.replace('synthetic-llama ', '')} {test} {split}"
                backend = r.get("backend", dev)
                if test.startswith("tg"):
                    roof = copy / (size * 2**20) if copy and size else None
                    self.tg[(wtype, backend, split)] = (speed, dev)
                    self.add(step, what, dev, speed, "t/s", roof, speed / roof if roof else None, 0.6)
                else:
                    flops = 2 * params * 1e6 * speed if params else None
                    self.add(step, what, dev, speed, "t/s", mm_big and mm_big / 1e12,
                             flops / mm_big if mm_big and flops else None, 0.25)
        for (w, backend, split), (v, dev) in list(self.tg.items()):
            if split.startswith("tensor"):
                base = next((b for (w2, _, s2), (b, _) in self.tg.items() if w2 == w and s2 == "none"), None)
                if base:
                    self.add("model-tp", f"meta device: tensor / none tg {w}", dev, v, "t/s", base, v / base, 0.8)
                else:
                    self.problem(f"tensor-split tg of {w} has no unsplit row to compare with")
            if backend == "VULKAN" and split == "none":
                cuda = next((b for (w2, b2, s2), (b, _) in self.tg.items()
                             if w2 == w and s2 == "none" and b2 != "VULKAN"), None)
                if cuda:
                    self.add("model-vulkan", f"Vulkan / {self.device} tg {w}", dev, v, "t/s", cuda, v / cuda, 0.7)
                else:
                    self.problem(f"Vulkan tg of {w} has no {self.device} row to compare with")

    def ours(self, step):
        """test -> t/s of the unsplit rows of a model-* or norep-* step."""
        rows = self.model_rows.get(step)
        if rows is None:
            rows = self.bench_rows(step)
        return {test: v for (_, _, split, test), (v, _) in rows.items() if split == "none"}

    # --- pairs of steps ----------------------------------------------------------------------
    def pairs(self):
        for log in sorted(glob.glob(os.path.join(self.logs, "peer-*.log"))):
            name = os.path.basename(log)[5:-4]
            step = f"peer-{name}"
            if name == "ops":
                continue
            theirs = {}
            for head, rows in md_tables(log):
                if "test" not in head or "t/s" not in head:
                    self.problem(f"{step}.log: a table without test or t/s columns: {head}")
                    continue
                for r in rows:
                    v = num(r.get("t/s"))
                    if v is None or not r.get("test"):
                        self.problem(f"{step}.log: row not read: {r['_line'][:160]}")
                        continue
                    theirs[r["test"]] = v
            if self.ok(step) and not theirs:
                self.problem(f"{step}.log: the step exited 0 but no llama-bench row was read")
            if not theirs:
                continue
            if f"model-{name}" not in self.steps:
                self.problem(f"{step}: llama.cpp ran on {name} but Tessera did not (no model-{name} step)")
                continue
            mine = self.ours(f"model-{name}")
            for test, v in theirs.items():
                m = mine.get(test)
                if m is None and self.ok(f"model-{name}"):
                    self.problem(f"{step}: llama.cpp has {test}, model-{name}.log has no unsplit {test} row")
                self.add(step, f"{name} {test}: Tessera / llama.cpp", self.device, m, "t/s", v,
                         m / v if m else None, 1.0)
        for log in sorted(glob.glob(os.path.join(self.logs, "norep-*.log"))):
            step = os.path.basename(log)[:-4]
            name = step[len("norep-"):]
            plain, mine = self.ours(step), self.ours(f"model-{name}")
            for test, v in plain.items():
                m = mine.get(test)
                if m is None and self.ok(f"model-{name}"):
                    self.problem(f"{step}: no {test} row in model-{name}.log to set beside it")
                self.add(step, f"{name} {test}: replay / launch each node", self.device, m, "t/s", v,
                         m / v if m else None, None)
        for log in sorted(glob.glob(os.path.join(self.logs, "fa-chunk-*.log"))):
            step = os.path.basename(log)[:-4]
            for test, v in self.ours(step).items():
                self.add(step, f"{step} {test}", self.device, v, "t/s", None, None, None)
        if self.ok("model-tp-1b-q4_0") or any(s.startswith("model-tp") and self.ok(s) for s in self.steps):
            if not any(x["what"].startswith("meta device") for x in self.res):
                self.problem("model-tp ran, but no tensor / none row came of it")
        if any(s.startswith("model-vulkan") and self.ok(s) for s in self.steps):
            if not any(x["what"].startswith("Vulkan /") for x in self.res):
                self.problem("model-vulkan ran, but no Vulkan / CUDA row came of it")
        self.peer_ops()

    def peer_ops(self):
        """llama.cpp's test-backend-ops perf figures, beside Tessera's on the same shape."""
        step = "peer-ops"
        try:
            lines = open(self.path(step), errors="replace").read().splitlines()
        except OSError:
            return
        read = 0
        for line in lines:
            m = re.match(r"\s*(MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=(\d+),k=(\d+)[^)]*\)).*?"
                         r"([0-9.]+) (GFLOPS|TFLOPS)", line)
            if not m:
                continue
            read += 1
            v = float(m.group(6)) * (1e3 if m.group(7) == "TFLOPS" else 1)
            t, mm_, n, k = m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5))
            self.add(step, f"llama.cpp {t} m={mm_} n={n} k={k}", f"{self.device} (llama.cpp)", v / 1e3,
                     "TFLOP/s", None, None, None)
            mine = self.ours_gemm.get((t, mm_, n, k, self.device))
            if mine is not None and n > 1:
                self.add(step, f"GEMM {t} m={mm_} n={n} k={k}: Tessera / llama.cpp", self.device,
                         mine / 1e3, "TFLOP/s", v / 1e3, mine / v if v else None,
                         1.0 if t in QUANT and n == 512 else None)
        if self.ok(step) and read == 0:
            self.problem("peer-ops.log: the step exited 0 but no MUL_MAT line was read")
        if self.ok(step) and self.ok("ops-cuda-peer-shape"):
            # Each of Tessera's GEMMs at llama.cpp's perf shape must find llama.cpp's figure.
            paired = {x["what"] for x in self.res if x["what"].endswith(": Tessera / llama.cpp")}
            for (t, m, n, k, d) in sorted(self.ours_gemm):
                if d == self.device and (m, k) == (4096, 14336) and n > 1 and \
                        f"GEMM {t} m={m} n={n} k={k}: Tessera / llama.cpp" not in paired:
                    self.problem(f"ops-cuda-peer-shape: GEMM {t} m={m} n={n} k={k} has no llama.cpp "
                                 "figure in peer-ops.log to set beside it")

    # --- the profile -------------------------------------------------------------------------
    def profile(self):
        self.prof = []
        try:
            text = open(self.path("profile"), errors="replace").read()
        except OSError:
            return
        at = text.find("GPU profile")
        if at >= 0:
            self.prof = [l for l in text[at:].splitlines()
                         if l.startswith(("GPU profile", "host per", "device per", "|"))]
        if self.ok("profile") and not self.prof:
            self.problem("profile.log: the step exited 0 but printed no \"GPU profile\" section")

    # --- output ------------------------------------------------------------------------------
    def render(self):
        def fmt(x, p=3):
            return "-" if x is None else (f"{x:.{p}g}" if isinstance(x, float) else str(x))

        ceil = self.ceil
        copy, mm, mm_big = (ceil.get("copy_bytes_per_s"), ceil.get("bf16_gemm_n512_flops"),
                            ceil.get("bf16_gemm_8192_flops"))
        lines = [f"GPU: {ceil.get('gpu', '?')}; torch {ceil.get('torch', '?')}; ceilings: copy "
                 f"{fmt(copy and copy / 1e9)} GB/s (read+write), bf16 GEMM n=512 "
                 f"{fmt(mm and mm / 1e12)} TFLOP/s, 8192^3 {fmt(mm_big and mm_big / 1e12)} TFLOP/s, "
                 f"bf16 GEMV {fmt((ceil.get('bf16_gemv_bytes_per_s') or 0) / 1e9)} GB/s, SDPA causal "
                 f"2048 {fmt(ceil.get('sdpa_causal_2048_ms'))} ms", ""]
        try:
            # The machine, the commit and any decision the run took (tile kernels off).
            run = [l.strip() for l in open(os.path.join(self.logs, "gpu.txt"), errors="replace") if l.strip()]
            lines += ["Run: " + "; ".join(run), ""] if run else []
        except OSError:
            pass
        if self.problems:
            lines += [f"Problems ({len(self.problems)}): rows this run should have given and did not", ""]
            lines += [f"- {p}" for p in self.problems] + [""]
        else:
            lines += ["Problems: none (every step that ran gave its rows)", ""]
        steps = [f"{n} {'ok' if rc == 0 else 'skipped' if rc == 125 else f'exit {rc}'} {s}s"
                 for n, (rc, s) in self.steps.items()]
        if steps:
            lines += ["Steps: " + "; ".join(steps), ""]
        lines += ["| what | device | value | unit | ceiling | ratio | target | met |",
                  "|---|---|---|---|---|---|---|---|"]
        for x in self.res:
            met = "-" if x["ratio"] is None or x["target"] is None else (
                "yes" if x["ratio"] >= x["target"] else "no")
            lines.append(f"| {x['what']} | {x['device']} | {fmt(x['value'], 4)} | {x['unit']} | "
                         f"{fmt(x['ceiling'], 4)} | {fmt(x['ratio'])} | {fmt(x['target'])} | {met} |")
        if self.prof:
            lines += ["", "Decode profile (TESSERA_GPU_PROFILE):", ""] + self.prof[:40]
        return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs")
    ap.add_argument("--strict", action="store_true", help="exit 1 when any problem is listed")
    ap.add_argument("--device", default="CUDA0", help="the device the run measured (CPU in CI's check)")
    ap.add_argument("--vk-device", default="VK0")
    a = ap.parse_args()
    t = Table(a.logs, a.device, a.vk_device)
    t.check_steps()
    t.conformance()
    t.ceilings()
    t.ops()
    t.models()
    t.pairs()
    t.profile()
    text = t.render()
    with open(os.path.join(a.logs, "perf.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.logs, "perf.json"), "w") as f:
        json.dump({"ceilings": t.ceil, "results": t.res, "problems": t.problems,
                   "steps": {k: {"rc": v[0], "seconds": v[1]} for k, v in t.steps.items()}}, f, indent=1)
    print(text)
    if a.strict and t.problems:
        print(f"gpu-perf-table: {len(t.problems)} problem(s) (--strict)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
