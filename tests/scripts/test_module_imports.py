"""scripts/trainbench's modules import each other without a cycle, no module takes a private (`_name`) name
from another (a module's private names are its own to change), and nightly tracking (trainbench.tracking)
imports nothing of PyTorch (trainbench.pytorch, torch): it runs where torch is not installed."""

import ast
import os

import pytest

PACKAGE = "trainbench"
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", PACKAGE)


def module_name(path: str, root: str) -> str:
    rel = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join([PACKAGE] + rel)


def package_of(module: str, path: str) -> str:
    return module if path.endswith("__init__.py") else module.rpartition(".")[0]


def imports_of(path: str, module: str):
    """(imported module, names taken from it) for every import in the file, module-level or in a function,
    resolved to absolute names; `from . import x` counts as an import of the submodule x."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = package_of(module, path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names = [a.name for a in node.names]
            yield source, names
            for name in names:   # `from . import torch_case`: the submodule itself
                yield f"{source}.{name}", []


def module_files(root: str):
    """{module: its file} for every module under root."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                files[module_name(path, root)] = path
    return files


def scan(root: str):
    """{module: {module it imports inside the package}} and [(module, source, private name)]."""
    graph, private = {}, []
    files = module_files(root)
    for module, path in files.items():
        edges = graph.setdefault(module, set())
        for source, names in imports_of(path, module):
            if source in files and source != module:
                edges.add(source)
                private += [(module, source, n) for n in names if n.startswith("_") and not n.startswith("__")]
    return graph, private


def find_cycle(graph):
    """One import cycle as a list of modules (the first repeated at the end), or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_package_has_no_import_cycle_and_takes_no_private_name():
    graph, private = scan(ROOT)
    assert "trainbench.pytorch.peers" in graph and "trainbench.pytorch.cases.cg" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    assert private == [], private


def test_nightly_tracking_imports_nothing_of_pytorch():
    """trainbench.tracking (and the errors it shares) imports neither trainbench.pytorch nor torch, at module level
    or in a function: the nightly's machine needs no PyTorch."""
    files = module_files(ROOT)
    tracking = [m for m in files if m == f"{PACKAGE}.errors" or m.startswith(f"{PACKAGE}.tracking")]
    assert f"{PACKAGE}.tracking.stats" in tracking
    wrong = [(m, source) for m in tracking for source, _ in imports_of(files[m], m)
             if source.split(".")[0] == "torch" or source.startswith(f"{PACKAGE}.pytorch")]
    assert wrong == [], wrong


@pytest.mark.parametrize("files, cycle, private", [
    ({"a.py": "from . import b\n", "b.py": "def f():\n    from .a import x\n"}, True, []),
    ({"a.py": "from .b import _hidden\n", "b.py": "_hidden = 1\n"}, False, [("a", "b", "_hidden")]),
    ({"a.py": "from .b import shown\n", "sub/__init__.py": "", "sub/c.py": "from ..a import y\n",
      "b.py": "shown = 1\n"}, False, []),
])
def test_the_walk_finds_a_cycle_and_a_private_import(tmp_path, files, cycle, private):
    """The check itself: a lazy import that closes a cycle and a private name are found, a clean tree passes."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph, found = scan(str(tmp_path))
    assert (find_cycle(graph) is not None) == cycle
    assert [(m.rpartition(".")[2], s.rpartition(".")[2], n) for m, s, n in found] == private
