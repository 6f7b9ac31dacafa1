"""The refit package imports one way: no import cycle among its modules,
counting the imports inside functions too (a cycle is one, whenever it
runs). Reads the sources only (TAP).

usage: check_imports.py BINDINGS_DIR"""
import ast
import os
import sys

pkg_dir = os.path.join(sys.argv[1], "refit")
mods = sorted(f[:-3] for f in os.listdir(pkg_dir) if f.endswith(".py"))


def imported(mod):
    """The refit modules mod imports: {name: line of the first import}."""
    with open(os.path.join(pkg_dir, mod + ".py")) as f:
        tree = ast.parse(f.read(), mod + ".py")
    out = {}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level == 0 and base.startswith("refit."):
                base = base[len("refit."):]
            elif node.level == 0:
                continue
            if base:
                names.append(base.split(".")[0])
            else:  # from . import x, y
                names += [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name[len("refit."):].split(".")[0] for a in node.names
                      if a.name.startswith("refit.")]
        for n in names:
            if n in mods and n not in ("__init__", mod):
                out.setdefault(n, node.lineno)
    return out


edges = {m: imported(m) for m in mods if m != "__init__"}

# Cycles: the strongly connected components with more than one module
# (Tarjan), each shown with its imports.
index, low, stack, on, comps = {}, {}, [], set(), []


def visit(v):
    index[v] = low[v] = len(index)
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
            comps.append(sorted(comp))


for m in sorted(edges):
    if m not in index:
        visit(m)

print("1..1")
if not comps:
    print("ok 1 - no import cycle among the %d modules of refit" % len(edges))
else:
    print("not ok 1 - import cycles in refit:")
    for comp in comps:
        print("#   cycle: %s" % " ".join(comp))
        for m in comp:
            for w, line in sorted(edges[m].items()):
                if w in comp:
                    print("#     %s.py:%d imports %s" % (m, line, w))
