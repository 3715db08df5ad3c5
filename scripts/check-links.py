#!/usr/bin/env python3
"""Checks the links of the README and the docs book.

    scripts/check-links.py [FILE.md ...]

Every relative Markdown link in README.md, docs/src/**/*.md, tests/reference/README.md and
examples/README.md (or the files named) must name a file inside the repository, and a `#fragment` must name a heading
of the linked Markdown file (GitHub / mdBook anchors: lower case, punctuation dropped, spaces as
hyphens). Links to other sites fail too: the docs stay inside the repository. Exits 1 listing
every broken link. .ci/run calls it.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]*)\)")
FENCE = re.compile(r"^\s*```")


def anchor(heading):
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    out = set()
    infence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            infence = not infence
        elif not infence and line.startswith("#"):
            out.add(anchor(line.lstrip("#")))
    return out


def links(path):
    infence = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            infence = not infence
            continue
        if infence:
            continue
        # Inline code is not a link.
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            yield n, target


def check(path):
    errors = []
    for n, target in links(path):
        where = "{}:{}".format(path.relative_to(ROOT), n)
        if re.match(r"^[a-z]+:", target):
            errors.append("{}: {} leaves the repository".format(where, target))
            continue
        file_part, _, frag = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists() or ROOT not in dest.parents and dest != ROOT:
            errors.append("{}: {} does not exist".format(where, target))
            continue
        if frag and dest.suffix == ".md" and frag not in anchors(dest):
            errors.append("{}: no heading #{} in {}".format(where, frag, dest.relative_to(ROOT)))
    return errors


def main():
    files = [pathlib.Path(f).resolve() for f in sys.argv[1:]] or (
        [ROOT / "README.md", ROOT / "tests/reference/README.md", ROOT / "examples/README.md"]
        + sorted((ROOT / "docs/src").rglob("*.md"))
    )
    errors = [e for f in files for e in check(f)]
    for e in errors:
        print(e)
    print("links: {} files, {} broken".format(len(files), len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
