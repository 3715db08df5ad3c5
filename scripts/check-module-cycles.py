#!/usr/bin/env python3
"""Fails when modules of one crate import each other in a circle.

    scripts/check-module-cycles.py [CRATE_DIR ...]

For every crate of the workspace (or the crate folders named), each `.rs` file under `src/` is a
module. A module depends on another when it names it through `crate::a::b` or `super::…`
(resolved to the deepest module the path names). Ancestors and descendants are not counted: a
parent declares and re-exports its children, and a child reading its parent's items is how Rust
nests. What is left are the edges between modules that are neither, and a strongly connected
group of two or more of them is a circle: no order exists in which to read them one after the
other. Test modules (`tests.rs`, `tests_*.rs`, `*/tests/*`) are left out: tests may reach
anywhere, and so may `#[cfg(test)]` modules. An import through an ancestor's re-export
(`crate::cpu::mul_mat_tile` for `cpu::matmul::mul_mat_tile`) counts as one to the ancestor, so
import from the defining module to keep the check whole. Exits 1 listing every circle with one
import site per edge. .ci/run calls it.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)
COMMENT = re.compile(r"//[^\n]*")
# `#[cfg(test)] mod x;` (a test-only module file) and `#[cfg(test)] mod x {` (an inline one).
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*([;{])")


def crate_dirs():
    manifest = (ROOT / "Cargo.toml").read_text()
    members = re.search(r"members\s*=\s*\[([^\]]*)\]", manifest).group(1)
    for m in re.findall(r'"([^"]+)"', members):
        if (ROOT / m / "src").is_dir():
            yield ROOT / m


def is_test(rel):
    name = rel.name
    return (
        name == "tests.rs"
        or name.startswith("tests_")
        or "tests" in rel.parts[:-1]
        or name.endswith("_golden.rs")
    )


def module_of(rel):
    """`src/a/b.rs` and `src/a/b/mod.rs` are ("a", "b"); lib.rs and main.rs are the root ()."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return tuple(parts)


def paths_in(text):
    """Every module path the text names: `crate::a::b::c`, `super::x`, and each member of a
    `use crate::a::{b, c::d}` group, as (root, [segments])."""
    text = COMMENT.sub("", text)
    out = []
    for root, prefix, group in USE_GROUP.findall(text):
        base = [s for s in prefix.split("::") if s]
        for item in re.split(r",", group):
            item = item.strip().split(" as ")[0].strip()
            if not item or item in ("self", "*") or "{" in item or "}" in item:
                continue
            out.append((root, base + [s for s in item.split("::") if s]))
    for root, rest in PATH.findall(text):
        out.append((root, [s for s in rest.split("::") if s]))
    return out


def resolve(mod, root, segs, modules):
    """The deepest existing module the path names."""
    if root == "crate":
        base = ()
    else:
        base = mod[:-1]
        while segs and segs[0] == "super":
            base = base[:-1]
            segs = segs[1:]
    best = base
    cur = base
    for s in segs:
        cur = cur + (s,)
        if cur in modules:
            best = cur
        else:
            break
    return best


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def circles(crate):
    src = crate / "src"
    files, texts, test_only = {}, {}, set()
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if is_test(rel):
            continue
        mod = module_of(rel)
        text = f.read_text(encoding="utf-8")
        for name, kind in TEST_MOD.findall(text):
            test_only.add(mod + (name,))
        # Inline test modules sit at the end of the file: read up to the first one.
        inline = [m.start() for m in TEST_MOD.finditer(text) if m.group(2) == "{"]
        files[mod] = f
        texts[mod] = text[: inline[0]] if inline else text
    for mod in list(files):
        if any(mod[: len(t)] == t for t in test_only):
            del files[mod]
    modules = set(files)
    edges = {m: {} for m in modules}
    for mod, f in files.items():
        for n, line in enumerate(texts[mod].splitlines(), 1):
            for root, segs in paths_in(line):
                dst = resolve(mod, root, list(segs), modules)
                if dst != mod and not related(mod, dst):
                    # Depending on a sibling's descendant is depending on that sibling: lift
                    # both ends to the children of their closest common ancestor.
                    k = 0
                    while k < min(len(mod), len(dst)) and mod[k] == dst[k]:
                        k += 1
                    a, b = mod[: k + 1], dst[: k + 1]
                    edges.setdefault(a, {}).setdefault(b, (f, n))
    # Tarjan's strongly connected components.
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(edges):
        if v not in index:
            visit(v)
    report = []
    for comp in out:
        names = ["::".join(c) for c in comp]
        lines = ["{}: modules {} import each other:".format(crate.relative_to(ROOT), ", ".join(names))]
        for a in comp:
            for b, (f, n) in edges.get(a, {}).items():
                if b in comp:
                    lines.append(
                        "    {} -> {} ({}:{})".format(
                            "::".join(a), "::".join(b), f.relative_to(ROOT), n
                        )
                    )
        report.append("\n".join(lines))
    return report


def main():
    dirs = [pathlib.Path(d).resolve() for d in sys.argv[1:]] or list(crate_dirs())
    found = [r for d in dirs for r in circles(d)]
    for r in found:
        print(r)
    print("module circles: {} crates, {} circles".format(len(dirs), len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
