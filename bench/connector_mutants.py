"""Mutants of vLLM's offloading connector, scheduler side: a stratified sample, one per function.

The connector's scheduler side (``vllm/distributed/kv_transfer/kv_connector/v1/offloading/
scheduler.py``, 2,462 lines in 0.33.0 and 2,671 in 0.34.0) holds thousands of mutation points; a
run of every mutant against both vLLM's own connector tests and kvgate's machines would take
days on a CPU. So the sample is drawn like this, the same way for every release:

1. The file is parsed (``ast``) and every mutation point is listed with the function it sits
   in (its qualified name, ``Class.method`` or ``function``; code outside any function is left
   out). The operators are the usual ones: a comparison flipped (``==``/``!=``, ``<``/``<=``,
   ``>``/``>=``, ``is``/``is not``, ``in``/``not in``), an arithmetic or bitwise operator
   swapped (``+``/``-``, ``*``/``//``, ``|``/``&``), ``and``/``or`` swapped, a ``not`` dropped,
   an integer constant plus one, a boolean constant flipped, ``+=``/``-=`` swapped, an
   assignment's or a return's value replaced by ``None``, a call statement removed (replaced by
   ``pass``), ``break``/``continue`` swapped. Points inside logging calls, docstrings and
   annotations are not listed (their mutants change no behaviour a test can see).
2. From each function's points one is drawn, by ``random.Random(f"{SEED}:{qualname}")``: the
   draw for a function depends only on the seed, its name and its own points, so a function
   unchanged between releases gets the same mutant in both. The first sample is seed 30; a
   second, seed 4507 (``SEED=4507`` in the environment), was drawn after the properties it
   measures were written, and its results are kept apart (``connector-VERSION-seed4507-*``);
   a third, seed 8128, was drawn once the second had been read (to write the properties its
   misses called for), and measures those (``connector-VERSION-seed8128-*``).

A mutant is the whole file, re-printed from the mutated tree (``ast.unparse``: comments go,
behaviour stays). ``install(path)`` loads it under the module's real name in place of the
installed file; tests/mutation/vllm_yardstick.py does that from ``KVGATE_CONNECTOR_MUTANT``
for both kinds of runs (kvgate's machines and vLLM's own tests).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report_page import write_cited

MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
SEED = 30  # issue 30: the first sample
# issue 45: a second sample, drawn after the properties it measures were written (SEED=4507)
SECOND_SEED = 4507
# issue 45 again: the second sample was read to write the next properties, so a third one,
# drawn before their runs and not read until they were written, measures them (SEED=8128)
THIRD_SEED = 8128

_COMPARE = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_BINOP = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.BitOr: ast.BitAnd,
    ast.BitAnd: ast.BitOr,
}
_SKIPPED_FIELDS = {"annotation", "returns", "decorator_list", "type_comment"}


@dataclass(frozen=True)
class Mutant:
    function: str  # the qualified name of the function it sits in
    index: int  # the node's place in the traversal (stable for one source text)
    kind: str  # which operator
    line: int
    text: str  # the mutated line, as the mutant prints it (one line)
    statement: tuple[int, int] = (0, 0)  # the lines of the statement it sits in

    @property
    def name(self) -> str:
        return f"{self.function}@{self.line}:{self.kind}"


def _is_log_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id == "logger"


def _walk(
    tree: ast.AST, spans: dict[int, tuple[int, int]] | None = None
) -> Iterator[tuple[int, ast.AST, str | None]]:
    """Every node in a fixed order, with its index and the function it sits in; ``spans``
    gets each node's enclosing statement's first and last line."""
    counter = 0
    spans = {} if spans is None else spans

    def visit(node, scope, qual, stmt=None):
        nonlocal counter
        index = counter
        counter += 1
        if isinstance(node, ast.stmt):
            stmt = node
        spans[index] = (
            getattr(stmt, "lineno", 0),
            getattr(stmt, "end_lineno", 0) or getattr(stmt, "lineno", 0),
        )
        if isinstance(node, ast.ClassDef):
            qual = qual + [node.name]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            qual = qual + [node.name]
            scope = ".".join(qual)
        yield index, node, scope
        if _is_log_call(node):
            return
        body = getattr(node, "body", None)
        for field, value in ast.iter_fields(node):
            if field in _SKIPPED_FIELDS:
                continue
            items = value if isinstance(value, list) else [value]
            for i, child in enumerate(items):
                if not isinstance(child, ast.AST):
                    continue
                if (
                    value is body
                    and i == 0
                    and isinstance(child, ast.Expr)
                    and isinstance(child.value, ast.Constant)
                    and isinstance(child.value.value, str)
                ):
                    continue  # a docstring
                yield from visit(child, scope, qual, stmt)

    yield from visit(tree, None, [])


def _kinds(node: ast.AST) -> list[str]:
    kinds = []
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _COMPARE:
        kinds.append("compare")
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP:
        kinds.append("binop")
    elif isinstance(node, ast.BoolOp):
        kinds.append("boolop")
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        kinds.append("drop not")
    elif isinstance(node, ast.Constant) and type(node.value) is bool:
        kinds.append("flip bool")
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        kinds.append("int plus one")
    elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub):
        kinds.append("augassign")
    elif isinstance(node, ast.Assign) and len(node.targets) == 1:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            kinds.append("assign None")
    elif isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value is None):
            kinds.append("return None")
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        if not _is_log_call(node.value):
            kinds.append("drop call")
    elif isinstance(node, (ast.Break, ast.Continue)):
        kinds.append("break/continue")
    return kinds


class _Apply(ast.NodeTransformer):
    def __init__(self, index: int, kind: str, indices: dict[int, int]):
        self.index, self.kind, self.indices = index, kind, indices
        self.done = False

    def visit(self, node):
        if self.indices.get(id(node)) == self.index:
            self.done = True
            return _mutate(node, self.kind)
        return super().visit(node)


def _mutate(node: Any, kind: str) -> Any:
    if kind == "compare":
        node.ops = [_COMPARE[type(node.ops[0])](), *node.ops[1:]]
    elif kind == "binop":
        node.op = _BINOP[type(node.op)]()
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind == "drop not":
        return node.operand
    elif kind == "flip bool":
        node.value = not node.value
    elif kind == "int plus one":
        node.value = node.value + 1
    elif kind == "augassign":
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
    elif kind in ("assign None", "return None"):
        node.value = ast.Constant(None)
    elif kind == "drop call":
        return ast.Pass()
    elif kind == "break/continue":
        return ast.Continue() if isinstance(node, ast.Break) else ast.Break()
    return node


def points(source: str) -> list[Mutant]:
    """Every mutation point of ``source`` inside a function."""
    tree = ast.parse(source)
    out: list[Mutant] = []
    spans: dict[int, tuple[int, int]] = {}
    for index, node, scope in _walk(tree, spans):
        if scope is None:
            continue
        for kind in _kinds(node):
            line = getattr(node, "lineno", 0)
            out.append(Mutant(scope, index, kind, line, "", spans.get(index, (line, line))))
    return out


def sample(source: str, seed: int = SEED) -> list[Mutant]:
    """One mutant per function (see the module docstring), in the file's order."""
    by_function: dict[str, list[Mutant]] = {}
    for point in points(source):
        by_function.setdefault(point.function, []).append(point)
    drawn = []
    for function, candidates in by_function.items():
        pick = random.Random(f"{seed}:{function}").choice(candidates)
        drawn.append(_with_text(source, pick))
    return drawn


def mutate(source: str, mutant: Mutant) -> str:
    """The whole mutated file."""
    tree = ast.parse(source)
    indices = {id(node): index for index, node, _ in _walk(tree)}
    applier = _Apply(mutant.index, mutant.kind, indices)
    tree = applier.visit(tree)
    if not applier.done:
        raise ValueError(f"mutant {mutant.name} not found in this source")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"


def _with_text(source: str, mutant: Mutant) -> Mutant:
    """The mutant, with the mutated statement as it prints (its first line)."""
    tree = ast.parse(source)
    for index, node, _ in _walk(tree):
        if index == mutant.index:
            mutated = _mutate(copy.deepcopy(node), mutant.kind)
            text = ast.unparse(mutated).splitlines()[0] if mutated is not None else ""
            before = ast.unparse(node).splitlines()[0]
            return dataclasses.replace(mutant, text=f"{before}  ->  {text}"[:200])
    raise ValueError(mutant.name)


# --------------------------------------------------------------------------- running the suite
# (python -m bench.connector_mutants VERSION [vllm|kvgate ...], JOBS=N for N at once, RERUN=1
# to run every mutant again;
# python -m bench.connector_mutants --report rewrites docs/mutation.md's connector tables)


ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "connector-mutation"
RESULTS = ROOT / "bench" / "results"
VLLM_TESTS = "tests/v1/kv_connector/unit/offloading_connector"
# The model vLLM's connector tests name (tests/v1/kv_connector/unit/utils.py), as a config only.
OPT_125M = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "hidden_size": 768,
    "ffn_dim": 3072,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "vocab_size": 50272,
    "max_position_embeddings": 2048,
    "word_embed_proj_dim": 768,
    "do_layer_norm_before": True,
    "activation_function": "relu",
    "enable_bias": True,
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
    "torch_dtype": "float16",
}
KVGATE_TESTS = "tests/mutation/test_vllm_connector.py"
# A run longer than this is a mutant that hangs the code under test (a lock never released):
# killed, as mutmut counts a timeout. Unmutated, either side takes 20-100 s here (2 shared cores).
TIMEOUT = 300


def release_python(version: str) -> Path:
    sys.path.insert(0, str(ROOT))
    from releases.vllm import envs_dir

    return envs_dir() / version / "bin" / "python"


def installed_source(version: str) -> str:
    code = f"import importlib.util as u; print(u.find_spec({MODULE!r}).origin)"
    done = subprocess.run(
        [str(release_python(version)), "-c", code], capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1]).read_text()


def vllm_tests(version: str) -> Path:
    """A folder holding only the ``tests/`` of the release's source distribution (so that the
    installed vLLM is the one imported), fetched with pip the first time."""
    where = BUILD / "sdist" / version
    if (where / VLLM_TESTS).is_dir():
        return where
    BUILD.mkdir(parents=True, exist_ok=True)  # a fresh checkout has no build folder
    tmp = Path(tempfile.mkdtemp(prefix="sdist-", dir=BUILD))
    pip = [str(release_python(version)), "-m", "pip", "download", "--no-binary", ":all:"]
    subprocess.run(  # metadata cannot be built here; --no-clean keeps the unpacked source
        [*pip, "--no-deps", "--no-build-isolation", "--no-clean", f"vllm=={version}", "-d", tmp],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
    )
    found = sorted(tmp.glob("pip-download-*/vllm_*/tests"))
    if not found:
        raise SystemExit(f"could not fetch vLLM {version}'s source distribution with pip")
    where.mkdir(parents=True, exist_ok=True)
    shutil.copytree(found[0], where / "tests")
    shutil.rmtree(tmp, ignore_errors=True)
    return where


def hf_home() -> Path:
    """A Hugging Face cache holding facebook/opt-125m's config.json alone (no weights)."""
    home = BUILD / "hf"
    repo = home / "hub" / "models--facebook--opt-125m"
    rev = "0" * 40
    snapshot = repo / "snapshots" / rev
    if not (snapshot / "config.json").exists():
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(rev)
        (snapshot / "config.json").write_text(json.dumps(OPT_125M, indent=1))
    return home


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPOTHESIS", "PYTEST"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(PYTHONHASHSEED="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


def run_vllm_tests(
    version: str,
    mutant: Path | None,
    timeout: int = TIMEOUT,
    paths: tuple[str, ...] = (VLLM_TESTS,),
    first_failure: bool = True,
    confcutdir: str = "tests/v1/kv_connector/unit",
) -> dict:
    """vLLM's own unit tests at ``paths`` of its source distribution (the connector's by
    default), stopping at the first failure unless ``first_failure`` is False; conftest files
    above ``confcutdir`` are not loaded."""
    where = vllm_tests(version)
    env = _env(
        {
            "PYTHONPATH": str(ROOT / "tests" / "mutation"),
            "HF_HOME": str(hf_home()),
            "KVGATE_VLLM_YARDSTICK": "1",
            "KVGATE_CONNECTOR_MUTANT": str(mutant or ""),
        }
    )
    args = ["-m", "pytest", *(["-x"] if first_failure else []), "-q", "-p", "vllm_yardstick"]
    args += ["-p", "no:cacheprovider", "-W", "ignore", "--confcutdir", confcutdir, *paths]
    return _run([str(release_python(version)), *args], where, env, timeout)


def run_kvgate(version: str, mutant: Path | None, timeout: int = TIMEOUT) -> dict:
    """kvgate's machines over vLLM's scheduling path (tests/mutation/test_vllm_connector.py)."""
    sys.path.insert(0, str(ROOT))
    from releases.vllm import MENDED

    env = _env(
        {
            "KVGATE_CONNECTOR_MUTANT": str(mutant or ""),
            "KVGATE_MUTATION_TARGET": MENDED[version],
        }
    )
    args = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
    args.append("--tb=short")  # the property broken, in the first ``E`` line
    cover: list[str] = []
    if mutant is None:  # the baseline: which lines of the connector the machine reaches
        data = BUILD / f"kvgate-{version}.coverage"
        cover = ["-m", "coverage", "run", f"--data-file={data}", "--include=*/offloading/sched*"]
    where = stage()
    env["PYTHONPATH"] = str(where)
    # a run with no verdict (the gate's exit 2) is written here and is not a kill
    ledger = BUILD / "no-verdict" / (mutant.stem if mutant else "baseline")
    shutil.rmtree(ledger, ignore_errors=True)
    env["KVGATE_NO_VERDICT_LEDGER"] = str(ledger)
    out = _run([str(release_python(version)), *cover, *args, KVGATE_TESTS], where, env, timeout)
    if mutant is None:
        out["lines"] = _covered(version, data)
    from bench.mutation import read_ledger

    lines = [f"{r['test']}: {r['line']}" for rs in read_ledger(ledger).values() for r in rs]
    if lines and out["exit"] == 0:
        out.update(killed=False, no_verdict=lines, why=lines[0][:300])
    return out


_STAGED: Path | None = None


def stage() -> Path:
    """kvgate as it stands when the suite starts, copied once (as bench/mutation.py stages it:
    impl/, model/, properties/ under kvgate/), so edits to the tree during a long run do not
    reach its later mutants; it is first on ``PYTHONPATH``, ahead of the editable install."""
    global _STAGED
    if _STAGED is None:
        sys.path.insert(0, str(ROOT))
        from bench.mutation import _ignore

        where = BUILD / "stage" / f"{os.getpid()}"
        if where.exists():
            shutil.rmtree(where)
        shutil.copytree(ROOT / "kvgate", where / "kvgate", ignore=_ignore)
        for part in ("impl", "model", "properties"):
            shutil.copytree(ROOT / part, where / "kvgate" / part, ignore=_ignore)
        shutil.copytree(ROOT / "tests", where / "tests", ignore=_ignore)
        shutil.copytree(ROOT / "releases", where / "releases", ignore=_ignore)  # the mends
        shutil.copy2(ROOT / "conftest.py", where / "conftest.py")
        shutil.copy2(ROOT / "pyproject.toml", where / "pyproject.toml")
        _STAGED = where
    return _STAGED


def _covered(version: str, data: Path) -> list[int]:
    code = (
        "import coverage, json, sys; c = coverage.Coverage(data_file=sys.argv[1]); c.load();"
        "d = c.get_data(); print(json.dumps(sorted(l for f in d.measured_files() "
        "if f.endswith('scheduler.py') for l in d.lines(f))))"
    )
    done = subprocess.run(
        [str(release_python(version)), "-c", code, str(data)], capture_output=True, text=True
    )
    return json.loads(done.stdout or "[]")


def _run(cmd: list[str], cwd: Path, env: dict, timeout: int) -> dict:
    start = time.perf_counter()
    try:
        done = subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        code, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, out = -1, f"timeout after {timeout} s"
    lines = [ln for ln in out.splitlines() if ln.strip()]
    failed = [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
    # what was raised, as the traceback's first ``E`` line says it (kvgate's: the property)
    raised = [ln[1:].strip() for ln in lines if ln.startswith("E ") and "Error" in ln]
    if failed and raised:
        failed[0] = f"{failed[0].split('::')[-1]}: {raised[0]}"
    return {
        "exit": code,
        "killed": code != 0,
        "timeout": code == -1,
        "seconds": round(time.perf_counter() - start, 1),
        "why": (failed[:1] or lines[-1:] or [""])[0][:300],
    }


def sample_name(version: str, seed: int = SEED) -> str:
    """A sample's name in file names: the release, and the seed unless it is the first."""
    return version if seed == SEED else f"{version}-seed{seed}"


def run_suite(
    version: str, sides=("vllm", "kvgate"), jobs: int = 1, rerun: bool = False, seed: int = SEED
) -> dict:
    """Every drawn mutant of ``version``'s connector scheduler against each side; the results
    are written to bench/results/connector-SAMPLE-SIDES.json as they come; a mutant that already
    has a verdict for a side keeps it unless ``rerun``."""
    source = installed_source(version)
    mutants = sample(source, seed)
    folder = BUILD / "mutants" / sample_name(version, seed)
    folder.mkdir(parents=True, exist_ok=True)
    # one file per release and side: the two sides may run at once, in separate processes
    out_file = RESULTS / f"connector-{sample_name(version, seed)}-{'-'.join(sides)}.json"
    result = json.loads(out_file.read_text()) if out_file.exists() else {}
    result.update(version=version, seed=seed, drawn=len(mutants), points=len(points(source)))
    rows = {r["name"]: r for r in result.get("mutants", [])}
    for m in mutants:
        rows.setdefault(m.name, {"name": m.name, "function": m.function, "kind": m.kind})
        rows[m.name].update(line=m.line, change=m.text)
    result["mutants"] = [rows[m.name] for m in mutants]

    def save():
        RESULTS.mkdir(parents=True, exist_ok=True)
        out_file.write_text(json.dumps(result, indent=1) + "\n")

    for side in sides:
        runner = run_vllm_tests if side == "vllm" else run_kvgate
        base = result.get(f"{side} baseline")
        if rerun or not base or base["killed"] or os.environ.get("RERUN_SURVIVORS") == "1":
            base = runner(version, None, timeout=3 * TIMEOUT)  # under coverage, on kvgate's
        result[f"{side} baseline"] = base
        save()
        if base["killed"]:
            raise SystemExit(f"{side} fails on the unmutated release: {base['why']}")

        reached = set(base.get("lines", ()))

        def one(m, side=side, runner=runner, reached=reached):
            again = os.environ.get("RERUN_SURVIVORS") == "1"  # a later tree, its survivors
            done = rows[m.name].get(side)
            if done is not None and not rerun and (done["killed"] or not again):
                return m.name, done
            first, last = m.statement
            if reached and not reached & set(range(first, last + 1)):
                # The unmutated run never executes the statement, and the run is deterministic
                # (derandomized, one hash seed): the mutant's run is the same run. Survives.
                rows[m.name][side] = {"killed": False, "unreached": True, "seconds": 0}
                save()
                return m.name, rows[m.name][side]
            path = folder / f"{m.index:05d}.py"
            path.write_text(mutate(source, m))
            rows[m.name][side] = runner(version, path)
            save()
            return m.name, rows[m.name][side]

        # the mutants without a kill yet first: what a shortened run most needs to say
        todo = sorted(mutants, key=lambda m: bool((rows[m.name].get(side) or {}).get("killed")))
        if side == "kvgate" and os.environ.get("PAIRED") == "1":
            # only the mutants vLLM's tests have already run (a run cut short by the clock)
            other = RESULTS / f"connector-{sample_name(version, seed)}-vllm.json"
            have = {r["name"] for r in json.loads(other.read_text())["mutants"] if "vllm" in r}
            todo = [m for m in mutants if m.name in have]
        with ThreadPoolExecutor(jobs) as pool:
            for name, verdict in pool.map(one, todo):
                print(
                    version,
                    side,
                    name,
                    "killed" if verdict["killed"] else "SURVIVED",
                    verdict["seconds"],
                    flush=True,
                )
    save()
    return result


# --------------------------------------------------------------------------- the report
def load(version: str, seed: int = SEED) -> dict:
    """Both sides' results for ``version``'s sample, merged by mutant."""
    merged: dict = {"version": version, "mutants": {}}
    for side in ("vllm", "kvgate"):
        path = RESULTS / f"connector-{sample_name(version, seed)}-{side}.json"
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for key in ("seed", "drawn", "points"):
            merged[key] = data.get(key)
        merged[f"{side} baseline"] = data.get(f"{side} baseline")
        for row in data["mutants"]:
            merged["mutants"].setdefault(row["name"], {}).update(row)
    return merged


def verdicts(version: str, seed: int = SEED) -> dict[str, dict]:
    import tomllib

    path = ROOT / "docs" / "mutation-verdicts.toml"
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    return data.get(f"connector-{sample_name(version, seed)}", {})


def markdown(version: str, seed: int = SEED) -> str:
    data = load(version, seed)
    rows = list(data["mutants"].values())
    done = [r for r in rows if "vllm" in r and "kvgate" in r]
    by_v = sum(r["vllm"]["killed"] for r in done)
    by_k = sum(r["kvgate"]["killed"] for r in done)
    both = sum(r["vllm"]["killed"] and r["kvgate"]["killed"] for r in done)
    only_k = [r for r in done if r["kvgate"]["killed"] and not r["vllm"]["killed"]]
    only_v = [r for r in done if r["vllm"]["killed"] and not r["kvgate"]["killed"]]
    told = verdicts(version, seed)
    out = [
        f"### Connector suite, vLLM {version}: {len(done)} of {data.get('drawn')} drawn mutants "
        f"run on both sides ({data.get('points')} mutation points in the file, seed "
        f"{data.get('seed')})",
        "",
        "| | killed | of | share |",
        "| --- | --- | --- | --- |",
        f"| vLLM's own connector unit tests | {by_v} | {len(done)} | "
        f"{by_v / max(1, len(done)):.0%} |",
        f"| kvgate's vLLM scheduler machine alone | {by_k} | {len(done)} | "
        f"{by_k / max(1, len(done)):.0%} |",
        f"| both | {both} | | |",
        "",
        f"Killed by kvgate only: {len(only_k)}; by vLLM's tests only: {len(only_v)}; "
        f"kvgate's runs with no verdict (exit 2, not kills): "
        f"{sum(bool(r['kvgate'].get('no_verdict')) for r in done)}. "
        f"Baselines (unmutated): vLLM's tests "
        f"{(data.get('vllm baseline') or {}).get('why', '?')!r}, "
        f"{(data.get('vllm baseline') or {}).get('seconds', '?')} s; kvgate "
        f"{(data.get('kvgate baseline') or {}).get('why', '?')!r}, "
        f"{(data.get('kvgate baseline') or {}).get('seconds', '?')} s.",
        "",
        "| mutant | change | vLLM's tests | kvgate | verdict on kvgate's survivor |",
        "| --- | --- | --- | --- | --- |",
    ]

    def cell(run):
        if run is None:
            return "not run"
        if run.get("unreached"):
            return "survived (statement never executed)"
        if run.get("timeout"):
            return "killed (hangs)"
        if run.get("no_verdict"):
            return "no verdict (exit 2): " + run["why"].replace("|", "/")
        return ("killed" if run["killed"] else "survived") + f", {run['seconds']} s"

    for r in rows:
        k = r.get("kvgate")
        verdict = ""
        if k is not None and not k["killed"]:
            v = told.get(r["name"], {})
            verdict = f"{v.get('verdict', 'open')}: {v.get('why', '')}".rstrip(": ")
        change = r.get("change", "").replace("|", "\\|")
        out.append(
            f"| `{r['name']}` | `{change[:90]}` | {cell(r.get('vllm'))} | {cell(k)} | {verdict} |"
        )
    return "\n".join(out) + "\n"


REPORT_BEGIN = "<!-- generated by python -m bench.connector_mutants --report: begin -->"
REPORT_END = "<!-- generated by python -m bench.connector_mutants --report: end -->"


def write_report(versions=("0.34.0", "0.33.0"), seeds=(SEED, SECOND_SEED, THIRD_SEED)) -> None:
    """Rewrite the generated part of docs/mutation.md's connector section from the results."""
    doc = ROOT / "docs" / "mutation.md"
    text = doc.read_text()
    head, _, rest = text.partition(REPORT_BEGIN)
    _, _, tail = rest.partition(REPORT_END)
    body = "\n".join(
        markdown(v, seed)
        for seed in seeds
        for v in versions
        if (RESULTS / f"connector-{sample_name(v, seed)}-vllm.json").exists()
    )
    write_cited(doc, f"{head}{REPORT_BEGIN}\n{body}{REPORT_END}{tail}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--report"]:
        write_report()
        raise SystemExit(0)
    version, *which = sys.argv[1:]
    jobs = int(os.environ.get("JOBS", "1"))
    seed = int(os.environ.get("SEED", str(SEED)))  # SEED=4507: the second sample
    # RERUN=1: every mutant again, the baseline too (a later tree of kvgate, or of the bench)
    rerun = os.environ.get("RERUN") == "1"
    run_suite(version, tuple(which) or ("vllm", "kvgate"), jobs, rerun, seed)
