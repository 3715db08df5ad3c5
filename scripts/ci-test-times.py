#!/usr/bin/env python3
"""Names the slowest test binaries of a `cargo test` run.

    scripts/ci-test-times.py BINARIES.json TEST.log [COUNT]

BINARIES.json is the output of `cargo test --no-run --message-format=json-render-diagnostics`
(it maps each test executable to its package and target); TEST.log is what `cargo test` printed.
Prints one line per test binary, slowest first (COUNT lines, default 12), with the time libtest
reported ("finished in ...") and its pass/fail/ignore counts, then the sum. .ci/run calls it after
the README's test command.
"""

import json
import os
import re
import sys

RUNNING = re.compile(r"^\s+Running (?:unittests )?(\S+) \((.+)\)\s*$")
DOCTESTS = re.compile(r"^\s+Doc-tests (\S+)\s*$")
RESULT = re.compile(
    r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored; .*finished in ([0-9.]+)s"
)


def package_name(package_id):
    """The package name of a cargo package id, old ("name 0.1.0 (path+...)") or new
    ("path+file:///...#name@0.1.0", or "...#0.1.0" when the name is the folder's) format."""
    if " " in package_id:
        return package_id.split(" ", 1)[0]
    frag = package_id.rsplit("#", 1)[-1]
    if "@" in frag:
        return frag.split("@", 1)[0]
    return package_id.split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]


def binaries(path):
    """Executable file name -> "package target-kind target-name"."""
    names = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            exe = msg.get("executable")
            if msg.get("reason") != "compiler-artifact" or not exe:
                continue
            target = msg.get("target", {})
            kind = (target.get("kind") or ["?"])[0]
            names[os.path.basename(exe)] = "{} {} {}".format(
                package_name(msg.get("package_id", "?")), kind, target.get("name", "?")
            )
    return names


def runs(log_path, names):
    """(seconds, label, passed, failed, ignored) per test binary, in the log's order."""
    out = []
    current = None
    with open(log_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = RUNNING.match(line)
            if m:
                exe = os.path.basename(m.group(2))
                current = names.get(exe, "{} ({})".format(m.group(1), exe))
                continue
            m = DOCTESTS.match(line)
            if m:
                current = "{} doc-tests".format(m.group(1))
                continue
            m = RESULT.match(line)
            if m and current is not None:
                out.append(
                    (float(m.group(5)), current, int(m.group(2)), int(m.group(3)), int(m.group(4)))
                )
                current = None
    return out


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    count = int(sys.argv[3]) if len(sys.argv) == 4 else 12
    rows = runs(sys.argv[2], binaries(sys.argv[1]))
    print("== slowest test binaries (libtest's own times)")
    for secs, label, passed, failed, ignored in sorted(rows, reverse=True)[:count]:
        print(
            "{:8.1f} s  {}  ({} passed, {} failed, {} ignored)".format(
                secs, label, passed, failed, ignored
            )
        )
    total = sum(r[0] for r in rows)
    print("{:8.1f} s  in {} test binaries".format(total, len(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
