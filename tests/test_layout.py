"""The layout holds: impl/ is only the system under test, the one import namespace is kvgate,
and no module of the tree imports itself back through another."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {
    "kvgate": "kvgate",
    "model": "kvgate.model",
    "impl": "kvgate.impl",
    "properties": "kvgate.properties",
}


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
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                )
                for imported in names:
                    assert not imported.startswith(
                        ("hypothesis", "kvgate.properties", "kvgate.model", "crosshair")
                    ), (name, imported)


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
    graph = {
        n: {d for d in deps if not n.startswith(d + ".") and not d.startswith(n + ".")}
        for n, deps in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                raise AssertionError("import loop: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def _tree_python_files() -> list[Path]:
    """Every Python file of the tree (not environments, caches or mutation copies)."""
    left_out = {"mutants", "build", "node_modules"}
    return [
        p
        for p in sorted(ROOT.rglob("*.py"))
        if not any(
            part.startswith(".") or part in left_out for part in p.relative_to(ROOT).parts[:-1]
        )
    ]


NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
# `noqa: CODE[, CODE] - why`: the codes it silences, then the reason.
WITH_REASON = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+-\s+\w")


def test_every_noqa_names_its_codes_and_says_why():
    bare = []
    for path in _tree_python_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found = NOQA.search(line)
            if found and not WITH_REASON.match(found.group("rest")):
                bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bare, "a noqa without its codes and reason:\n" + "\n".join(bare)


def test_the_guardrails_are_pinned_and_run_before_the_tests():
    """ruff and mypy come from the `lint` extra at the versions constraints.txt pins; .ci/run
    runs .ci/lint before the tests, and the pre-commit hooks run the same three checks. mypy
    checks every package (kvgate with its parts, and bench), with no blanket ignores."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().split()
        if "==" in line and not line.startswith("#")
    )
    lint = {
        re.match(r"[A-Za-z0-9_.-]+", req).group(0)
        for req in project["project"]["optional-dependencies"]["lint"]
    }
    assert lint == {"ruff", "mypy"} and lint <= set(pins), (lint, pins)
    assert project["tool"]["ruff"]["line-length"] == 100
    ci = (ROOT / ".ci" / "run").read_text()
    lint_at = ci.index("\n.ci/lint\n")
    assert lint_at < ci.index("\npython -m pytest"), "lint runs before the tests"
    assert "lint]'" in ci[:lint_at], ".ci/run installs the lint extra first"
    hooks = (ROOT / ".pre-commit-config.yaml").read_text()
    for entry in ("ruff check", "ruff format --check", ".ci/lint mypy"):
        assert f"entry: {entry}" in hooks, entry
    lint_script = (ROOT / ".ci" / "lint").read_text()
    assert re.search(r"^\s*mypy -p kvgate -p bench$", lint_script, re.M), "mypy over every package"
    assert re.search(r"for entry in kvgate/\*", lint_script), "all of kvgate/ is staged"
    assert re.search(r"for entry in model impl properties;", lint_script), "and its parts"
    mypy_hook = hooks[hooks.index("entry: .ci/lint mypy") :]
    files = re.search(r"files: \^\((.*?)\)/", mypy_hook).group(1).split("|")
    assert {"kvgate", "model", "impl", "properties", "bench"} <= set(files), files
    mypy = project["tool"]["mypy"]
    for one in [mypy, *mypy.get("overrides", [])]:
        assert not one.get("ignore_errors") and "disable_error_code" not in one, one
    checked = ("kvgate", "model", "impl", "properties", "bench")
    for path in [p for top in checked for p in (ROOT / top).rglob("*.py")]:
        for line in path.read_text().splitlines():
            if "type: ignore" in line:  # only on a line, for a named code
                assert re.search(r"#\s*type:\s*ignore\[[a-z-, ]+\]", line), (path, line)


# --------------------------------------------------------------------------- one name per module

# Run with ``python -S`` (no site-packages: no install of any kind) from the tree's root.
NEVER_INSTALLED = """
import importlib, importlib.util, json, sys
sys.path.insert(0, {root!r})
found = {{n: getattr(importlib.util.find_spec(n), "origin", None)
         for n in ("kvgate.model", "kvgate.impl", "kvgate.properties", "kvgate.cli",
                   "kvgate.tests", "kvgate.bench", "kvgate.kvgate", "kvgate.docs")}}
importlib.import_module("kvgate.impl.base")
importlib.import_module("kvgate.model.cache")
refused = {{}}
for name in ("impl", "impl.base", "model", "model.cache", "properties"):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        refused[name] = str(exc)
files = {{}}
for name, module in list(sys.modules.items()):
    if (getattr(module, "__file__", None) or "").startswith({root!r} + "/"):
        files.setdefault(module.__file__, []).append(name)
print(json.dumps({{"found": found, "refused": refused,
                  "twice": {{f: n for f, n in files.items() if len(n) > 1}}}}))
"""


def _python_json(*args: str, cwd: Path):
    """What a fresh interpreter run with ``args`` in ``cwd`` printed, as JSON."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_source_tree_never_installed_serves_exactly_the_three_parts():
    answer = _python_json("-S", "-c", NEVER_INSTALLED.format(root=str(ROOT)), cwd=ROOT)
    found = answer["found"]
    for part in ("model", "impl", "properties"):
        assert found[f"kvgate.{part}"] == str(ROOT / part / "__init__.py"), found
    assert found["kvgate.cli"] == str(ROOT / "kvgate" / "cli" / "__init__.py")
    for stray in ("kvgate.tests", "kvgate.bench", "kvgate.kvgate", "kvgate.docs"):
        assert found[stray] is None, (stray, found[stray])
    refused = answer["refused"]
    assert set(refused) == {"impl", "impl.base", "model", "model.cache", "properties"}, refused
    assert "this folder is kvgate.impl" in refused["impl.base"]
    assert "this folder is kvgate.model" in refused["model.cache"]
    assert answer["twice"] == {}, answer["twice"]


SECOND_CHECKOUT = """
import json, kvgate, kvgate.model, kvgate.impl, kvgate.properties, kvgate.properties.oracle
import kvgate.gate
print(json.dumps({n: m.__file__ for n, m in (("kvgate", kvgate), ("kvgate.model", kvgate.model),
    ("kvgate.impl", kvgate.impl), ("kvgate.properties", kvgate.properties),
    ("kvgate.properties.oracle", kvgate.properties.oracle), ("kvgate.gate", kvgate.gate))}))
"""


def test_a_second_checkout_never_mixes_its_parts_with_the_installed_one(tmp_path):
    """kvgate is installed (editable) from this tree; from a second checkout, ``import kvgate``
    takes that checkout's ``kvgate/``, and its three parts must come from the same checkout,
    not from the installed tree (which an editable install's finder would hand out)."""
    import shutil

    second = tmp_path / "second"
    ignore = shutil.ignore_patterns("__pycache__")
    for part in ("kvgate", "model", "impl", "properties"):
        shutil.copytree(ROOT / part, second / part, ignore=ignore)
    files = _python_json("-c", SECOND_CHECKOUT, cwd=second)
    mixed = {n: f for n, f in files.items() if not Path(f).resolve().is_relative_to(second)}
    assert not mixed, f"loaded from another tree than {second}: {mixed}"


def test_no_file_of_the_tree_is_loaded_under_two_names_here():
    """In this test process (the installed tree, its root on ``sys.path``): the three folders'
    own names are refused, and every file of the tree that is loaded has one name."""
    import importlib
    import sys

    for name in ("impl", "model", "properties", "impl.scheduler"):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            assert "is not its name" in str(exc) or "No module named" in str(exc), exc
        else:
            raise AssertionError(f"{name} was imported under its folder's name")
    importlib.import_module("kvgate.properties.oracle")
    names: dict[str, list[str]] = {}
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        path = Path(file).resolve() if file else None
        inside = path is not None and path.is_relative_to(ROOT)
        if inside and not path.relative_to(ROOT).parts[0].startswith("."):
            names.setdefault(str(Path(file).resolve()), []).append(name)
    assert names, "no module of the tree is loaded"
    twice = {f: n for f, n in names.items() if len(n) > 1}
    assert not twice, twice


def test_the_python_floor_is_one_the_tree_runs_on():
    """pyproject's requires-python, ruff's target and mypy's version name one floor, and the
    tree runs on it: under CI (which runs on the floor) the interpreter is that version."""
    import os
    import sys

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=(\d+)\.(\d+)", config["project"]["requires-python"])
    assert floor, config["project"]["requires-python"]
    major, minor = int(floor.group(1)), int(floor.group(2))
    assert config["tool"]["ruff"]["target-version"] == f"py{major}{minor}"
    assert config["tool"]["mypy"]["python_version"] == f"{major}.{minor}"
    assert sys.version_info[:2] >= (major, minor)
    if os.environ.get("CI"):
        assert sys.version_info[:2] == (major, minor), "CI must run on the floor it claims"


def test_every_module_says_what_it_holds_and_the_tree_page_is_current():
    """Each module's docstring opens with what it holds (docs/tree.md is made of those first
    sentences, by docs/make_tree.py); the page lists exactly the tracked modules."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tree", ROOT / "docs" / "make_tree.py")
    assert spec is not None and spec.loader is not None
    make_tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_tree)
    bare = [str(p) for p in make_tree.modules() if make_tree.first_sentence(p) == "(no docstring)"]
    assert not bare, f"modules without a docstring: {bare}"
    page = (ROOT / "docs" / "tree.md").read_text()
    assert page == make_tree.page(), "docs/tree.md is not current: run python docs/make_tree.py"
