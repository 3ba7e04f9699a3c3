#!/usr/bin/env python3
"""Import cycles between the modules of a crate (default: appliance/src).

A module is a top-level file or directory under src/ (`routes`, `cli`, `server`, ...); an edge
A -> B is any `crate::B` path in A's files (use statements and inline paths; comments and
doc links are ignored). Prints the edges of every strongly connected component with more than
one module and exits 1 if there is one.

    python3 scripts/module-cycles.py [appliance/src]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "appliance/src")
mods = {}
for p in root.rglob("*.rs"):
    rel = p.relative_to(root)
    top = rel.parts[0].removesuffix(".rs")
    if top in ("lib", "main"):
        continue
    mods.setdefault(top, []).append(p)

edges = {m: set() for m in mods}
path_re = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
group_re = re.compile(r"\buse\s+crate::\{([^;]*)\}", re.S)
for m, files in mods.items():
    for f in files:
        text = "\n".join(
            line.split("//")[0] for line in f.read_text().splitlines()
        )
        # cfg(test) modules are not part of the build graph.
        text = text.split("#[cfg(test)]\nmod tests")[0]
        found = set(path_re.findall(text))
        for g in group_re.findall(text):
            found.update(re.findall(r"(?:^|[,{\s])([a-z_][a-z0-9_]*)(?=\s*(?:::|,|\}|$))", g))
        for d in found:
            if d in mods and d != m:
                edges[m].add(d)

# Tarjan's strongly connected components.
index, low, stack, on, out = {}, {}, [], set(), []
counter = [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(edges[v]):
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
        out.append(sorted(comp))


sys.setrecursionlimit(10000)
for v in sorted(edges):
    if v not in index:
        visit(v)
cycles = [c for c in out if len(c) > 1]
for c in cycles:
    print("cycle:", ", ".join(c))
    for a in c:
        for b in sorted(edges[a]):
            if b in c:
                print(f"  {a} -> {b}")
if not cycles:
    print(f"no import cycles among the {len(mods)} modules of {root}")
sys.exit(1 if cycles else 0)
