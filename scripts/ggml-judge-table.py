#!/usr/bin/env python3
"""Reads test-backend-ops' console output for one device and prints a markdown table per op:
passed / failed / not supported. Exits 1 when a case failed or the run did not finish (a crash
or an abort leaves no "Backend <device>: OK/FAIL" line).

    scripts/ggml-judge-table.py DEVICE LOG
"""
import re
import sys
from collections import defaultdict

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A case line may follow a message the tool wrote to stderr on the same line.
CASE = re.compile(r"(?:^|\s)  ([A-Z0-9_]+)\((.*)\): (.*)$")


def main() -> int:
    device, path = sys.argv[1], sys.argv[2]
    counts = defaultdict(lambda: [0, 0, 0])  # passed, failed, not supported
    failed = []
    finished = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for raw in f:
            line = ANSI.sub("", raw.rstrip("\n"))
            m = CASE.search(line)
            if m:
                op, params, status = m.groups()
                if status.endswith("OK"):
                    counts[op][0] += 1
                elif status.endswith("FAIL"):
                    counts[op][1] += 1
                    failed.append(f"{op}({params}): {status}")
                elif status.startswith("not supported"):
                    counts[op][2] += 1
                continue
            fin = re.match(rf"^  Backend {re.escape(device)}: (OK|FAIL)$", line)
            if fin:
                finished = fin.group(1)
    print(f"\n### test-backend-ops on {device}\n")
    print("| op | passed | failed | not supported |")
    print("|---|---|---|---|")
    total = [0, 0, 0]
    for op in sorted(counts):
        p, fl, ns = counts[op]
        total = [total[0] + p, total[1] + fl, total[2] + ns]
        print(f"| {op} | {p} | {fl} | {ns} |")
    print(f"| **all** | {total[0]} | {total[1]} | {total[2]} |")
    for case in failed[:50]:
        print(f"FAILED: {case}")
    if finished is None:
        print(f"test-backend-ops did not finish on {device} (see {path})", file=sys.stderr)
        return 1
    if total[1] or finished != "OK":
        return 1
    if total[0] == 0:
        print(f"no case ran on {device}: nothing was judged", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
