"""No import circle among the project's modules, counting the imports placed inside functions and those made
through `importlib.import_module`; and no import inside a function that the module already makes at its top.

An import inside a function hides a circle from Python (nothing fails at start-up) but not from a reader: the two
modules still need each other, so neither can be read, tested or moved alone. This walks every module of the
project's packages with `ast`, takes every import statement at any depth (module level, functions, methods), and
looks for strongly connected components of more than one module. Imports under `if TYPE_CHECKING:` never run and
do not count; neither does the implicit import of a package's `__init__` by its submodules.

`importlib.import_module(name)` counts when its name is known without running the code: a string constant, or an
f-string of constants, `__package__` and `__name__` whose last part is computed (`f"{__package__}.{info.name}"`,
a discovery loop over the package's own modules): that stands for every public module of the package (not
`_private`, not `__main__`, which discovery skips). A name computed any other way (a dict lookup, an attribute of
a module object) is not followed.
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
    """Every Import/ImportFrom and every call at any depth, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _is_import_module(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module" and isinstance(f.value, ast.Name)
            and f.value.id == "importlib") or (isinstance(f, ast.Name) and f.id == "import_module")


def _dynamic_name(arg: ast.expr, name: str, package: str) -> str | None:
    """The module name an `import_module` argument evaluates to, "*" standing for a computed last part; None when
    it is not known without running the code."""
    known = {"__name__": name, "__package__": package}
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.Name) and arg.id in known:
        return known[arg.id]
    if not isinstance(arg, ast.JoinedStr):
        return None
    parts = []
    for i, v in enumerate(arg.values):
        if isinstance(v, ast.Constant):
            parts.append(str(v.value))
        elif isinstance(v.value, ast.Name) and v.value.id in known:
            parts.append(known[v.value.id])
        elif i == len(arg.values) - 1 and "".join(parts).endswith("."):
            parts.append("*")  # a computed last part: any module of the package before it
        else:
            return None
    return "".join(parts)


def _dynamic_imports(tree: ast.AST, name: str, package: str, known: set[str]) -> set[str]:
    """The project modules `importlib.import_module` calls with a known name import (see the module docstring)."""
    found = set()
    for node in _import_nodes(tree):
        if not (isinstance(node, ast.Call) and _is_import_module(node) and node.args):
            continue
        target = _dynamic_name(node.args[0], name, package)
        if target is None:
            continue
        if target.startswith("."):  # import_module(".x", __package__)
            target = package + target
        if target.endswith(".*"):
            parent = target[:-2]
            found |= {m for m in known if m.rpartition(".")[0] == parent and not m.rpartition(".")[2].startswith("_")}
        elif target in known:
            found.add(target)
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules that module `name` (at `path`) imports: `import a.b`, `from a import b` (b a submodule
    or a name in a), `from .x import y` resolved against the module's package, and `importlib.import_module` calls
    whose name is known (see the module docstring)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found = _dynamic_imports(tree, name, package, known) - {name}
    for node in _import_nodes(tree):
        if isinstance(node, ast.Call):
            continue
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


def _sources(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> set[str]:
    """The modules one import statement loads: `import a.b` a.b; `from a import b` a, or a.b where that is a
    module of the project; relative imports resolved against `package`."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join([*up, base] if base else up)
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}


def _top_level(tree: ast.Module):
    """The import statements a module runs when it is loaded: its body, and the branches of top-level `try` and
    `if` (except `if TYPE_CHECKING:`, which never runs)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not _is_type_checking(node):
            stack += node.body + node.orelse
        elif isinstance(node, ast.Try):
            stack += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]


def repeated_imports(name: str, path: Path, known: set[str]) -> list[str]:
    """`file:line: statement` for each import inside a function from a module that the module's top already
    imports. An import goes into a function to load a module late (or to break a circle); a module loaded at the
    top is loaded already, so the repeat only hides from the reader what the module depends on: name it at the
    top."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    top = set().union(*(_sources(node, package, known) for node in _top_level(tree)))
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out |= {f"{where}:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(fn)
                    if isinstance(node, (ast.Import, ast.ImportFrom)) and _sources(node, package, known) & top}
    return sorted(out)


def test_the_project_has_no_import_circle():
    graph = import_graph(module_files())
    found = cycles(graph)
    assert not found, "import circles (counting imports inside functions and importlib's):\n" + "\n".join(
        _path_within(graph, c) for c in found)


def test_no_function_repeats_an_import_of_its_module():
    files = module_files()
    found = [line for name, path in files.items() for line in repeated_imports(name, path, set(files))]
    assert not found, "imports inside functions that the module already makes at its top:\n" + "\n".join(found)


def _plant(tmp_path: Path, modules: dict[str, str]) -> dict[str, Path]:
    """A package `pkg` of the given modules (name -> source) under tmp_path, with an empty __init__; its files."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    for name, text in {"__init__": "", **modules}.items():
        (pkg / f"{name}.py").write_text(text)
    return module_files(tmp_path, ("pkg",))


def test_the_walk_finds_a_circle_hidden_in_functions(tmp_path):
    """A planted circle: a imports b at module level, b imports c inside a function, c imports a inside a method
    with a relative import; and an import under TYPE_CHECKING that would close a second circle does not count."""
    graph = import_graph(_plant(tmp_path, {
        "a": "from pkg.b import f\n",
        "b": "def f():\n    import pkg.c\n    return pkg.c\n",
        "c": "class C:\n    def m(self):\n        from .a import f\n        return f\n",
        "d": "from typing import TYPE_CHECKING\nfrom pkg import e\nif TYPE_CHECKING:\n    from pkg.a import f\n",
        "e": "def g():\n    from pkg import d\n"}))
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.e"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"]]
    assert _path_within(graph, ["pkg.a", "pkg.b", "pkg.c"]) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"


def test_the_walk_follows_importlib(tmp_path):
    """Planted: a discovery loop over the package's own modules (`f"{__package__}.{info.name}"`) whose plug-in
    imports it back, and a constant `import_module("pkg.b")` closed by a function-level import; private modules and
    `__main__` are not discovered, and a name from a dict lookup is not followed."""
    graph = import_graph(_plant(tmp_path, {
        "reg": "import importlib\nimport pkgutil\n\ndef discover(path):\n    for info in pkgutil.iter_modules(path):\n"
               "        importlib.import_module(f\"{__package__}.{info.name}\")\n",
        "plug": "from pkg.reg import discover\n",
        "_private": "from pkg import reg\n",
        "__main__": "from pkg.reg import discover\n",
        "a": "import importlib\nB = importlib.import_module('pkg.b')\n",
        "b": "def f():\n    from pkg import a\n",
        "c": "from importlib import import_module\nWHERE = {'x': 'pkg.reg'}\n"
             "def f(k):\n    return import_module(WHERE[k])\n"}))
    assert graph["pkg.reg"] == {"pkg.a", "pkg.b", "pkg.c", "pkg.plug"} and graph["pkg.c"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.plug", "pkg.reg"]]


def test_a_repeated_import_is_found(tmp_path):
    """Planted: functions import again from modules the top imports (plainly, another name of the same module, a
    relative import inside a method); another submodule of the same package, a module whose submodule the top
    imports, or what the top imports only under TYPE_CHECKING is no repeat."""
    files = _plant(tmp_path, {"d": "", "sub1": "", "sub2": "", "m": (
        "from typing import TYPE_CHECKING\nimport os\nimport torch.nn as nn\nfrom a.b import c\nfrom .d import e\n"
        "from . import sub1\nif TYPE_CHECKING:\n    from f import g\n"
        "def one():\n    import os\n    from a.b import x\n"
        "class K:\n    def two(self):\n        from .d import h\n"
        "def fine():\n    import torch\n    from f import g\n    from . import sub2\n    import json\n")})
    assert repeated_imports("pkg.m", files["pkg.m"], set(files)) == [
        "m.py:10: import os", "m.py:11: from a.b import x", "m.py:14: from .d import h"]
