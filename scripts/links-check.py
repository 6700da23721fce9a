#!/usr/bin/env python3
"""Every link between the docs points somewhere (run by scripts/docs-test.sh):
a relative link in README.md, docs/*.md, TESTING.md, CHANGELOG.md or the
client's README names a file that exists, and its #anchor a heading of that
file (GitHub's slugs). Exit 1 with a line per broken link."""

import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent
pages = [root / "README.md", root / "TESTING.md", root / "CHANGELOG.md", root / "crates/ticket-client/README.md"]
pages += sorted((root / "docs").glob("*.md"))


def slug(heading):
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


problems = []
for page in pages:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        where = page.relative_to(root)
        if not dest.exists():
            problems.append(f"{where}: link to {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: link to {target}: no such heading")
for problem in problems:
    print(problem)
if problems:
    sys.exit(1)
print(f"links-check: the links of {len(pages)} pages point somewhere")
