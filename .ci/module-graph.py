#!/usr/bin/env python3
"""Checks the crate's module graph from `cargo modules dependencies` (DOT on stdin).

Collapses every item to the top-level module that defines it (`journal::sqlite::event::append`
-> `journal`), keeps the "uses" edges between different top-level modules, and fails when they
form a cycle. Prints the edges (the import graph a reader meets) with --print.
"""
import re
import sys
from collections import defaultdict

CRATE = "durable_sessions"
edges = defaultdict(set)
for line in sys.stdin:
    m = re.match(r'\s*"([^"]+)" -> "([^"]+)" \[label="uses"', line)
    if not m:
        continue
    a, b = (p.split("::") for p in m.groups())
    if a[0] != CRATE or b[0] != CRATE or len(a) < 2 or len(b) < 2:
        continue  # the crate root's re-exports, or an external item
    ma, mb = a[1], b[1]
    if ma != mb:
        edges[ma].add(mb)

if "--print" in sys.argv:
    for a in sorted(edges):
        print(f"{a} -> {', '.join(sorted(edges[a]))}")

# Depth-first search for a cycle.
state, stack = {}, []


def visit(n):
    state[n] = 1
    stack.append(n)
    for m in sorted(edges.get(n, ())):
        if state.get(m) == 1:
            cycle = stack[stack.index(m):] + [m]
            sys.exit("import cycle between modules: " + " -> ".join(cycle))
        if m not in state:
            visit(m)
    stack.pop()
    state[n] = 2


for n in sorted(edges):
    if n not in state:
        visit(n)
print(f"module graph: {len(edges)} modules with imports, no cycle")
