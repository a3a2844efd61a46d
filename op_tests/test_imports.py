"""The package's import graph has no cycle, lazy imports included (CPU, static: nothing is
imported).

Every ``import`` / ``from ... import`` statement of every module under ``aiter_mla/`` counts,
at module level and inside functions (a lazy import still ties the two modules together: a
cycle through one works only as long as nobody moves it to the top). Relative imports are
resolved against the importing module; ``from X import name`` is an edge to ``X.name`` when
that is a module of the package, else to ``X``; a package module named in a string that is
imported by name (``importlib.import_module``'s argument, the ``_LAZY`` table of ``aiter_mla``'s
lazy attributes) is an edge too. Imports of other packages are ignored.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "aiter_mla"


def module_files() -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of the package."""
    out: dict[str, Path] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    return files[name].name == "__init__.py"


def _absolute(module: str, level: int, target: str | None, files: dict[str, Path]) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not _is_package(module, files):
        base = base[:-1]            # a plain module's relative imports start at its package
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, files: dict[str, Path]) -> list[tuple[str, int]]:
    """``[(imported package module, line)]`` of every import statement in ``module``."""
    tree = ast.parse(files[module].read_text(encoding="utf-8"), filename=str(files[module]))
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in files:   # ``import a.b.c``: the deepest known module
                    name = name.rpartition(".")[0]
                if name:
                    found.append((name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, node.level, node.module, files)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in files:
                    found.append((sub, node.lineno))
                elif base in files:
                    found.append((base, node.lineno))
        elif _lazy_table(node) or _import_module_call(node):
            # modules named in strings that are imported by name: importlib.import_module's
            # argument, and aiter_mla's table of lazy attributes (_LAZY) that feeds it
            for const in ast.walk(node):
                if isinstance(const, ast.Constant) and const.value in files:
                    found.append((const.value, const.lineno))
    return [(m, line) for m, line in found if m != module]


def _lazy_table(node) -> bool:
    return (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
            and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets))


def _import_module_call(node) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    f = node.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module") or (isinstance(f, ast.Name) and f.id == "import_module")


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: first line}}`` over the package."""
    files = module_files()
    graph: dict[str, dict[str, int]] = {}
    for module in files:
        edges: dict[str, int] = {}
        for target, line in imports_of(module, files):
            edges.setdefault(target, line)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path = [start]
        stack = [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
                continue
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, {}))))
    return None


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Cycles found one after another, each broken at its first edge before the next search
    (every cycle of the graph shares an edge with one of them)."""
    graph = {k: dict(v) for k, v in graph.items()}
    found = []
    cycle = find_cycle(graph)
    while cycle is not None:
        found.append(cycle)
        del graph[cycle[0]][cycle[1]]
        cycle = find_cycle(graph)
    return found


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    files = module_files()
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        rel = files[a].relative_to(ROOT).as_posix()
        steps.append(f"  {a} -> {b}   ({rel}:{graph[a][b]})")
    return "\n".join(steps)


def test_graph_sees_relative_and_lazy_imports():
    """The scanner itself: relative imports resolve, function-level imports count."""
    graph = import_graph()
    # module level, relative one dot: ``from .reduce import mla_reduce_v1``
    assert "aiter_mla.ops.reduce" in graph["aiter_mla.ops.decode"]
    # module level, two dots, a submodule named in the import list: ``from .. import arch``
    assert "aiter_mla.arch" in graph["aiter_mla.ops.decode"]
    # function level (``import_module`` aside): report.write_outputs imports plots lazily
    assert "aiter_mla.bench.plots" in graph["aiter_mla.bench.report"]
    # a package's own relative imports start at the package: aiter_mla/jit/__init__.py
    assert "aiter_mla.jit.core" in graph["aiter_mla.jit"]


def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n\n".join(_describe(c, graph) for c in found)


def test_reference_scheduler_does_not_import_the_code_it_checks():
    """The pure-Python reference scheduler is what the metadata op and kernel are tested
    against; it must stand alone (an import of aiter_mla.ops.metadata, even a lazy one, let
    the reference run the op's own code)."""
    graph = import_graph()
    assert "aiter_mla.ops.metadata" not in graph["aiter_mla.ops.metadata_reference"], \
        graph["aiter_mla.ops.metadata_reference"]


def test_find_cycle_reports_one():
    assert find_cycle({"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": 1}, "b": {}, "c": {"b": 2}}) is None


def test_dir_lists_each_name_once():
    """dir(aiter_mla) after a lazy op was used: every name once (the fresh-user trial saw each
    used op twice)."""
    import aiter_mla

    aiter_mla.mla_decode_fwd   # noqa: B018 (loads the lazy attribute)
    names = dir(aiter_mla)
    assert len(names) == len(set(names)) and "mla_decode_fwd" in names
