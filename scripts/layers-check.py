#!/usr/bin/env python3
"""Imports run one way (run by scripts/docs-test.sh).

src/lib.rs's module comment lists the extension's modules in numbered
layers. A module may import from its own layer or the layers below, never
from a layer above, and no modules import each other round a circle (a
folder's files count as one module). Every module of src/ is in exactly
one layer. The same no-circle rule holds for each crate under crates/.
Exit 1 with a line per breach."""

import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent.parent


def imports(src: pathlib.Path) -> dict[str, set[str]]:
    """Top-level module -> top-level modules of the same crate it names."""
    graph: dict[str, set[str]] = {}
    for file in sorted(src.rglob("*.rs")):
        relative = file.relative_to(src)
        module = relative.parts[0].removesuffix(".rs")
        if module in ("lib", "main"):
            continue
        text = re.sub(r"//[^\n]*", "", file.read_text(encoding="utf-8"))
        named = set(re.findall(r"\bcrate::(\w+)", text))
        for group in re.findall(r"\bcrate::\{([^}]*)\}", text):
            named.update(re.findall(r"(?:^|,)\s*(\w+)", group))
        # super:: from a folder's file is the folder itself; super::super::x
        # (or super::x from a top-level file) is a sibling module.
        pattern = r"\bsuper::super::(\w+)" if len(relative.parts) > 1 else r"\bsuper::(\w+)"
        named.update(re.findall(pattern, text))
        graph.setdefault(module, set()).update(named - {module, "self"})
    modules = set(graph)
    return {m: {d for d in deps if d in modules} for m, deps in graph.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def declared_layers(lib: str) -> dict[str, int]:
    """Module -> layer number, from lines `//! N. title:` and the
    backticked module names of the `//! - ` items under each."""
    layer_of: dict[str, int] = {}
    layer = None
    for line in lib.splitlines():
        if not line.startswith("//!"):
            continue
        heading = re.match(r"//! (\d+)\. ", line)
        if heading:
            layer = int(heading.group(1))
            continue
        item = re.match(r"//! - `(\w+)/?`", line)
        if item and layer is not None:
            if item.group(1) in layer_of:
                problems.append(f"src/lib.rs names `{item.group(1)}` in two layers")
            layer_of[item.group(1)] = layer
    return layer_of


problems: list[str] = []
src = root / "src"
graph = imports(src)
layer_of = declared_layers((src / "lib.rs").read_text(encoding="utf-8"))
for module in sorted(set(graph) - set(layer_of)):
    problems.append(f"src/{module}: in no layer of src/lib.rs's module comment")
for module in sorted(set(layer_of) - set(graph)):
    problems.append(f"src/lib.rs names `{module}`, which is not a module of src/")
for module, deps in sorted(graph.items()):
    for dep in sorted(deps):
        if module in layer_of and dep in layer_of and layer_of[dep] > layer_of[module]:
            problems.append(f"src/{module} (layer {layer_of[module]}) imports {dep} (layer {layer_of[dep]}), a layer above")
crates = [src] + sorted(p / "src" for p in (root / "crates").iterdir() if (p / "src").is_dir())
for crate in crates:
    for component in circles(imports(crate) if crate != src else graph):
        problems.append(f"{crate.relative_to(root)}: modules import each other round a circle: {', '.join(component)}")

for problem in problems:
    print(problem)
if problems:
    sys.exit(1)
print(f"layers-check: {len(graph)} modules of src/ in {len(set(layer_of.values()))} layers, no import upward, no circle in {len(crates)} crates")
