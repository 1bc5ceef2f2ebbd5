"""No import circle among the project's modules, counting the imports placed inside functions.

An import inside a function hides a circle from Python (nothing fails at start-up) but not from a reader: the two
modules still need each other, so neither can be read, tested or moved alone. This walks every module of the
project's packages with `ast`, takes every import statement at any depth (module level, functions, methods), and
looks for strongly connected components of more than one module. Imports under `if TYPE_CHECKING:` never run and
do not count; neither does the implicit import of a package's `__init__` by its submodules.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("modules", "ablations", "sweeps", "analysis")


def module_files(root: Path = REPO, packages=PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages (a package is named by its __init__.py)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom at any depth, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that module `name` (at `path`) imports: `import a.b`, `from a import b` (b a submodule
    or a name in a), `from .x import y` resolved against the module's package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a non-module attribute: its longest module prefix
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph(files: dict[str, Path]) -> dict[str, set[str]]:
    known = set(files)
    return {name: imports_of(name, path, known) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []

    def visit(v):
        # iterative Tarjan: (node, iterator over its successors)
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, succ = work[-1]
            for w in succ:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _path_within(graph: dict[str, set[str]], comp: list[str]) -> str:
    """One circle through the component, as `a -> b -> ... -> a`, for the failure message."""
    members, start = set(comp), comp[0]
    seen, path = {start: None}, [start]
    frontier = [start]
    while frontier:  # breadth-first from start back to start inside the component
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    chain = [v]
                    while seen[chain[-1]] is not None:
                        chain.append(seen[chain[-1]])
                    return " -> ".join([*reversed(chain), start])
                if w not in seen:
                    seen[w] = v
                    nxt.append(w)
        frontier = nxt
    return " -> ".join(path)


def test_the_project_has_no_import_circle():
    graph = import_graph(module_files())
    found = cycles(graph)
    assert not found, "import circles (counting imports inside functions):\n" + "\n".join(
        _path_within(graph, c) for c in found)


def test_the_walk_finds_a_circle_hidden_in_functions(tmp_path):
    """A planted circle: a imports b at module level, b imports c inside a function, c imports a inside a method
    with a relative import; and an import under TYPE_CHECKING that would close a second circle does not count."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    import pkg.c\n    return pkg.c\n")
    (pkg / "c.py").write_text("class C:\n    def m(self):\n        from .a import f\n        return f\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nfrom pkg import e\nif TYPE_CHECKING:\n"
                              "    from pkg.a import f\n")
    (pkg / "e.py").write_text("def g():\n    from pkg import d\n")
    graph = import_graph(module_files(tmp_path, ("pkg",)))
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.e"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]
    assert _path_within(graph, ["pkg.a", "pkg.b", "pkg.c"]) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"
