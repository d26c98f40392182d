"""The layout holds: impl/ is only the system under test, the one import namespace is kvgate,
and no module of the tree imports itself back through another."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"kvgate": "kvgate", "model": "kvgate.model", "impl": "kvgate.impl",
           "properties": "kvgate.properties"}


def modules() -> dict[str, Path]:
    """Every project module under its import name."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (top-level and inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def test_impl_imports_neither_hypothesis_nor_the_harness():
    for name, path in modules().items():
        if not name.startswith("kvgate.impl"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""]
                for imported in names:
                    assert not imported.startswith(("hypothesis", "kvgate.properties",
                                                    "kvgate.model", "crosshair")), (name, imported)


def test_the_model_never_imports_impl_or_the_harness():
    for name, path in modules().items():
        if name.startswith("kvgate.model"):
            deps = imports(name, path, set(modules()))
            assert not {d for d in deps if not d.startswith("kvgate.model")}, (name, deps)


def test_the_distribution_installs_kvgate_only():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]
    assert packages and all(p == "kvgate" or p.startswith("kvgate.") for p in packages)
    assert {p for p in packages if p.count(".") <= 1} >= set(FOLDERS.values())
    assert all(v.startswith("kvgate.") for v in project["project"]["scripts"].values())


def test_no_import_loop():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    # A package's __init__ re-exporting its own modules is not a loop through another module.
    graph = {n: {d for d in deps if not n.startswith(d + ".") and not d.startswith(n + ".")}
             for n, deps in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import loop: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
