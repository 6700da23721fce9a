#!/usr/bin/env python3
"""The README's source map is the tree (run by scripts/docs-test.sh).

Every path the "## Source map" section of README.md names in backticks
exists, and every Rust and SQL file of the extension and its crates is
named: by its path, or by its file name in a list item that names its
folder (`src/counters/` ... `store.rs`). Exit 1 with a line per mismatch."""

import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
readme = (root / "README.md").read_text(encoding="utf-8")
section = re.search(r"^## Source map\n(.*?)(?=^## )", readme, re.S | re.M)
if not section:
    sys.exit("source-map-check: README.md has no '## Source map' section")
text = section.group(1)
items = re.split(r"\n(?=- )", text)
named = set(re.findall(r"`([^`\s]+)`", text))

problems = []
for path in sorted(named):
    if "/" in path and not (root / path).exists():
        problems.append(f"README.md source map names {path}, which does not exist")

files = [p for pattern in ("src/**/*.rs", "crates/*/src/**/*.rs", "sql/*.sql") for p in root.glob(pattern)]
for file in sorted(files):
    relative = file.relative_to(root).as_posix()
    folder = relative.rsplit("/", 1)[0] + "/"
    if relative in named:
        continue
    if any(f"`{folder}`" in item and f"`{file.name}`" in item for item in items):
        continue
    problems.append(f"README.md source map does not name {relative}")

for problem in problems:
    print(problem)
if problems:
    sys.exit(1)
print(f"source-map-check: {len(files)} files named, {len([p for p in named if '/' in p])} paths exist")
