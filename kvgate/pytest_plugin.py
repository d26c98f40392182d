"""kvgate inside a pytest run (the ``pytest11`` entry point ``kvgate``: installing kvgate is
enough). A maintainer gates a manager from a test file::

    from kvgate.pytest_plugin import gate

    test_cpu_offloading = gate("vllm", known_defects=["vllm:kv_offload_stores_skipped"])

or from the command line (``pytest --kvgate-target vllm``) or the ini file (``kvgate_targets``).
Each (target, machine) is one test item, ``test_cpu_offloading[vllm/manager]``, selectable
with ``-k``; a machine that does not apply to a target, or cannot run here, is a skipped item
that says why. An item runs the machine through the runner ``kvgate check`` uses
(``kvgate.gate.run_one``), so the two agree; a counterexample is a test failure showing
the shrunk steps, the answer that differed and the ``kvgate check`` line that repeats it.

Settings follow Hypothesis's conventions: the profile is ``gate(profile=)``, else
``--kvgate-profile``, else ``$HYPOTHESIS_PROFILE``, else ``ci`` under ``$CI``, else ``dev`` (the
rule ``kvgate check`` follows); ``--hypothesis-seed`` seeds the search; the example database is
the profile's unless ``gate(database=)``, ``--kvgate-database`` or ``$KVGATE_DATABASE`` names a
directory or Redis. ``--kvgate-database`` also becomes the session's default Hypothesis database,
which is what HypoFuzz requires of the tests it fuzzes (docs/fuzzing.md): a campaign and the next
CI run then share it.

Inert unless asked: with no gate in the collected files and no ``--kvgate-target``, the plugin
adds options and nothing else, and imports nothing of kvgate. A suite's own Hypothesis profiles
named like kvgate's (``dev``, ``ci``, ``thorough``) stay its own: kvgate's are registered only
around its own items.
"""

from __future__ import annotations

import os
import re
import shlex
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

PROFILE_NAMES = ("dev", "ci", "thorough", "crosshair")


# --------------------------------------------------------------------------- what a user writes


@dataclass(frozen=True)
class Gate:
    """A gate declared in a test file: ``gate(...)`` makes one; the plugin collects it."""

    targets: tuple[str, ...]
    machines: str | None = None
    profile: str | None = None
    known_defects: tuple[str, ...] = ()
    max_examples: int | None = None
    steps: int | None = None
    database: str | None = None


def target_spec(target: Any) -> str:
    """A target as ``kvgate check --target`` spells it: a spec string as it is; a class or
    factory as ``MODULE:ATTR``, with ``vllm=`` before it when a class it derives from is vLLM's
    (it then follows vLLM's manager interface)."""
    if isinstance(target, str):
        return target
    if not callable(target):
        raise TypeError(f"gate(): a target is a spec string, a class or a factory, not {target!r}")
    spec = f"{target.__module__}:{target.__qualname__}"
    bases = getattr(target, "__mro__", ())
    if any(str(getattr(b, "__module__", "")).startswith("vllm.") for b in bases):
        return f"vllm={spec}"
    return spec


def gate(
    *targets: Any,
    machines: str | Iterable[str] | None = None,
    profile: str | None = None,
    known_defects: Iterable[str] = (),
    max_examples: int | None = None,
    steps: int | None = None,
    database: str | None = None,
) -> Gate:
    """Gate ``targets`` (spec strings as ``kvgate check --target`` takes them, or classes) on
    ``machines`` (names, or a comma-joined string; default every machine that applies and
    can run here) under ``profile``; ``known_defects`` names what is declared known (a metric,
    an event field or an interface answer: ``properties/known.py``). Assign the result to a
    name pytest collects (``test_...``)."""
    if not targets:
        raise TypeError("gate() needs at least one target")
    if machines is not None and not isinstance(machines, str):
        machines = ",".join(machines)
    if isinstance(known_defects, str):
        known_defects = [known_defects]
    return Gate(
        tuple(target_spec(t) for t in targets),
        machines,
        profile,
        tuple(known_defects),
        max_examples,
        steps,
        database,
    )


# --------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvgate", "kvgate: gate a KV-cache offloading manager")
    group.addoption(
        "--kvgate-target",
        action="append",
        default=[],
        metavar="T",
        help="gate this target (a spec as `kvgate check --target` takes it), repeatable",
    )
    group.addoption(
        "--kvgate-machine",
        default=None,
        metavar="M[,M...]",
        help="machines for the --kvgate-target gates (default: every machine that applies)",
    )
    group.addoption(
        "--kvgate-known-defect",
        action="append",
        default=[],
        metavar="NAME",
        help="declare a known defect (a metric, event field or interface answer) for the "
        "--kvgate-target gates, repeatable",
    )
    group.addoption(
        "--kvgate-profile",
        default=None,
        metavar="P",
        help="kvgate profile for every gate that names none (default: $HYPOTHESIS_PROFILE, "
        "else ci when $CI is set, else dev)",
    )
    group.addoption(
        "--kvgate-max-examples",
        type=int,
        default=None,
        metavar="N",
        help="examples per item (default: the profile's)",
    )
    group.addoption(
        "--kvgate-database",
        default=None,
        metavar="DIR|redis://HOST:PORT",
        help="example database every gate shares (default: $KVGATE_DATABASE, else the "
        "profile's); it also becomes the session's Hypothesis database, as HypoFuzz needs",
    )
    parser.addini("kvgate_targets", "targets gated as --kvgate-target gates them", type="args")
    parser.addini("kvgate_machine", "machines for the kvgate_targets gates", default="")
    parser.addini(
        "kvgate_known_defects", "known defects declared for the kvgate_targets gates", type="args"
    )


def _usage(what: str, exc: BaseException) -> pytest.UsageError:
    return pytest.UsageError(f"{what}: {exc}")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvgate: a kvgate gate item (one machine checking one target)"
    )
    value = config.getoption("kvgate_max_examples", None)
    if value is not None and value < 1:
        raise pytest.UsageError(f"--kvgate-max-examples {value}: must be at least 1")
    profile = config.getoption("kvgate_profile", None)
    if profile is not None and profile not in PROFILE_NAMES:
        raise pytest.UsageError(
            f"--kvgate-profile {profile!r}: not a kvgate profile; one of {', '.join(PROFILE_NAMES)}"
        )
    command_line = _command_line_gate(config)
    if command_line is not None:
        known = command_line.known_defects
        if known:
            _kvgate_profiles()
            from kvgate.properties.known import KnownDefectError, check_declarations

            try:
                check_declarations(known)
            except KnownDefectError as exc:
                raise pytest.UsageError(f"--kvgate-known-defect: {exc}") from None
    spec = config.getoption("kvgate_database", None)
    if spec:
        from hypothesis import settings

        _kvgate_profiles()
        try:
            db = _open_database(spec)
        except Exception as exc:
            raise pytest.UsageError(one_line_of(exc)) from None
        # HypoFuzz fuzzes only the tests whose database is the session's default one.
        settings.register_profile("kvgate-shared-database", parent=settings.default, database=db)
        settings.load_profile("kvgate-shared-database")


def one_line_of(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


def _command_line_gate(config: pytest.Config) -> Gate | None:
    targets = list(config.getoption("kvgate_target", None) or []) or list(
        config.getini("kvgate_targets") or []
    )
    if not targets:
        return None
    known = list(config.getoption("kvgate_known_defect", None) or []) or list(
        config.getini("kvgate_known_defects") or []
    )
    return Gate(
        tuple(targets),
        config.getoption("kvgate_machine", None) or config.getini("kvgate_machine") or None,
        None,
        tuple(known),
    )


# --------------------------------------------------------------------------- profiles


_KVGATE_PROFILES: dict[str, Any] = {}


def _registered(names: Iterable[str]) -> dict[str, Any]:
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    out = {}
    for name in names:
        try:
            out[name] = settings.get_profile(name)
        except InvalidArgument:
            pass
    return out


def _kvgate_profiles() -> dict[str, Any]:
    """kvgate's profiles, imported once without taking over a suite's own profiles of the same
    names: theirs are put back at once (and after each kvgate item)."""
    if not _KVGATE_PROFILES:
        theirs = _registered(PROFILE_NAMES)
        from kvgate.properties import profiles

        _KVGATE_PROFILES.update(_registered(profiles.PROFILES))
        _register(theirs)
    return _KVGATE_PROFILES


def _register(profiles: dict[str, Any]) -> None:
    from hypothesis import settings

    for name, value in profiles.items():
        settings.register_profile(name, parent=value)


class _KvgateProfiles:
    """kvgate's profiles registered for the duration of one item; the suite's back after."""

    def __enter__(self):
        ours = _kvgate_profiles()
        self.theirs = _registered(ours)
        _register(ours)
        return self

    def __exit__(self, *exc):
        _register(self.theirs)


# --------------------------------------------------------------------------- collection


def _open_database(spec: str):
    from kvgate.gate import open_database

    return open_database(spec)


@dataclass
class Case:
    """One item: one machine checking one target, with everything the run needs."""

    gate_name: str
    spec: str
    machine: str
    profile: str
    known: tuple[str, ...]
    max_examples: int | None
    steps: int | None
    database: str | None
    seed: int | None
    target: Any = None  # the resolved Target
    left_out: str = ""  # why this machine does not run on this target
    error: str = ""  # a usage or target error, one line
    # the item's user_properties: what a JUnit report shows of the run (<properties>)
    properties: list = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{_id_part(self.spec)}/{self.machine}"

    def repro(self) -> str:
        """The ``kvgate check`` command that runs this item's machine on its target alone."""
        words = ["kvgate", "check", "--target", self.spec, "--machine", self.machine]
        words += ["--profile", self.profile]
        if self.seed is not None:
            words += ["--seed", str(self.seed)]
        if self.max_examples is not None:
            words += ["--max-examples", str(self.max_examples)]
        if self.steps is not None:
            words += ["--steps", str(self.steps)]
        for name in self.known:
            words += ["--known-defect", name]
        if self.database:
            words += ["--database", self.database]
        return " ".join(shlex.quote(w) for w in words)

    # What HypoFuzz reads off an item it fuzzes: the settings, and the machine class (below).
    @property
    def settings(self):
        from hypothesis import settings

        with _KvgateProfiles():
            base = settings.get_profile(self.profile)
        overrides: dict[str, Any] = {}
        if self.max_examples is not None:
            overrides["max_examples"] = self.max_examples
        if self.steps is not None:
            overrides["stateful_step_count"] = self.steps
        if self.database:
            overrides["database"] = _open_database(self.database)
        return settings(base, **overrides)


def _id_part(spec: str) -> str:
    """A target spec as an item id part that ``-k`` can name: ``vllm``, ``impl:arc``,
    ``vllm-releases.vllm_mends:SkipCountedOnce``."""
    return re.sub(r"[^\w:.+-]", "-", spec)


class GateFailure(AssertionError):
    """A counterexample, or a declared known defect that no longer occurs: the report is the
    text, no traceback."""


class GateError(Exception):
    """A target or declaration that cannot be checked (one line)."""


class GateItem(pytest.Function):
    """One kvgate item: runs its case's machine on its case's target."""

    case: Case

    def repr_failure(self, excinfo):
        if excinfo.errisinstance((GateFailure, GateError)):
            return _report(self, str(excinfo.value))
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, self.name


def _report(item: GateItem, text: str):
    """The report as pytest shows a failure: the whole text in the failures section, its first
    line alone in the short summary (``-rA``, where a plain string would print it all twice) and
    as the JUnit ``message``; built from pytest's own report classes, so that pytest-xdist sends
    it from a worker as it sends a traceback. Where those classes differ, the plain text."""
    try:
        from _pytest._code.code import (
            ReprEntryNative,
            ReprExceptionInfo,
            ReprFileLocation,
            ReprTraceback,
        )

        lines = [line + "\n" for line in text.splitlines()]
        return ReprExceptionInfo(
            reprtraceback=ReprTraceback([ReprEntryNative(lines)], None, "native"),
            reprcrash=ReprFileLocation(str(item.path), 0, text.splitlines()[0] if lines else ""),
        )
    except (ImportError, TypeError):
        return text


_RESOLVED: dict[str, Any] = {}


def _resolve(spec: str):
    if spec not in _RESOLVED:
        from kvgate.gate import resolve_targets

        _RESOLVED[spec] = resolve_targets([spec])[0]
    return _RESOLVED[spec]


def _cases(name: str, g: Gate, config: pytest.Config) -> list[Case]:
    """The items of a gate: every (target, machine) the plan runs, and one skipped item per
    machine it leaves out; a gate that cannot be planned is one item failing with the reason."""
    _kvgate_profiles()  # first: importing kvgate registers its profiles
    from kvgate.gate import MACHINES, UsageError, choose_profile, plan_runs
    from kvgate.properties.adapters import TargetError
    from kvgate.properties.known import KnownDefectError, check_declarations

    seed = config.getoption("hypothesis_seed", None)
    db = (
        g.database or config.getoption("kvgate_database", None) or os.environ.get("KVGATE_DATABASE")
    )

    def case(spec: str, machine: str, **kw) -> Case:
        return Case(
            name,
            spec,
            machine,
            profile,
            known,
            g.max_examples or config.getoption("kvgate_max_examples", None),
            g.steps,
            db or None,
            int(seed) if seed is not None else None,
            **kw,
        )

    profile, known = "ci", g.known_defects
    try:
        profile = g.profile or config.getoption("kvgate_profile", None) or choose_profile(None)
        if profile not in PROFILE_NAMES:
            raise UsageError(f"profile {profile!r}: one of {', '.join(PROFILE_NAMES)}")
        known = check_declarations(g.known_defects)
        if g.machines:
            for m in g.machines.split(","):
                if m.strip() not in MACHINES and m.strip() != "all":
                    raise UsageError(f"unknown machine {m!r}; one of {', '.join(MACHINES)}")
        targets = [_resolve(spec) for spec in g.targets]
        plan = plan_runs(g.machines, targets)
    except (UsageError, TargetError, KnownDefectError) as exc:
        return [case(", ".join(g.targets), g.machines or "all", error=one_line_of(exc))]
    out = [case(target.spec, kind, target=target) for kind, target in plan.runs]
    named = g.machines.split(",") if g.machines and g.machines != "all" else None
    for kind, why, specs in plan.left_out:
        if named is None or kind in named:  # a machine the gate did not name is no item
            out += [case(spec, kind, left_out=why) for spec in specs]
    return out


def _items(parent, name: str, g: Gate) -> list[GateItem]:
    items = []
    for c in _cases(name, g, parent.config):
        item = GateItem.from_parent(
            parent,
            name=f"{name}[{c.id}]" if not c.error else name,
            callobj=_bound_run(c),
        )
        item.case = c
        c.properties = item.user_properties
        item.add_marker(pytest.mark.kvgate)
        item.add_marker(pytest.mark.hypothesis)  # a Hypothesis test (`-m hypothesis`, HypoFuzz)
        if c.left_out:
            item.add_marker(pytest.mark.skip(reason=f"left out: {c.machine} ({c.left_out})"))
        items.append(item)
    return items


def _bound_run(c: Case):
    """A method of its own per case (HypoFuzz reads attributes off the item's function)."""

    def runTest(self) -> None:
        run_case(self)

    return types.MethodType(runTest, c)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector, name, obj):
    if isinstance(obj, Gate) and collector.funcnamefilter(name):
        return _items(collector, name, obj)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    g = _command_line_gate(config)
    if g is not None:
        items.extend(_items(session, "kvgate", g))


# options that apply only to the --kvgate-target gates, and options for every gate item
_TARGET_GATE_OPTIONS = ("kvgate_machine", "kvgate_known_defect")
_ITEM_OPTIONS = ("kvgate_profile", "kvgate_max_examples", "kvgate_database")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def unused_options(config: pytest.Config, items: Iterable[Any]) -> list[str]:
    """One line for each kvgate option given that has nothing to act on: the ``--kvgate-target``
    options without a target, and the item options where no kvgate item was collected."""
    given = [n for n in (*_TARGET_GATE_OPTIONS, *_ITEM_OPTIONS) if config.getoption(n, None)]
    lines = []
    if _command_line_gate(config) is None:
        lines += [
            f"{_flag(n)} applies to the --kvgate-target gates, and none is given "
            "(gate() in a test file takes machines= and known_defects=): it had no effect"
            for n in given
            if n in _TARGET_GATE_OPTIONS
        ]
    if not any(isinstance(item, GateItem) for item in items):
        lines += [
            f"{_flag(n)} given, but no kvgate item was collected (no gate() in the collected "
            "files, no --kvgate-target): it had no effect"
            for n in given
            if n in _ITEM_OPTIONS
        ]
    return lines


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session):
    """Say which kvgate options had nothing to act on; then, for HypoFuzz, which fuzzes an item
    whose function names a state machine class: each selected kvgate item's machine, built for
    its target with its known defects, and keyed in the example database as the runner keys it
    (so a campaign's finds are what a run replays)."""
    for line in unused_options(session.config, session.items):
        session.config.issue_config_time_warning(pytest.PytestConfigWarning(f"kvgate: {line}"), 2)
    _order_for_xdist(session)
    if not _fuzzing(session.config):
        return
    from kvgate.properties.search.hypothesis_private import let_hypofuzz_save_shrunk_failures

    let_hypofuzz_save_shrunk_failures()
    for item in session.items:
        c = getattr(item, "case", None)
        if not isinstance(item, GateItem) or c.error or c.left_out:
            continue
        func = item.obj.__func__
        func._hypothesis_state_machine_class = _fuzz_machine(c)
        func._hypothesis_internal_use_settings = c.settings


def _order_for_xdist(session) -> None:
    """In an xdist worker, a small session's items in the order whose first round-robin
    hand-out (``--dist load``, the default) balances the workers (kvgate/xdist_order.py). Every
    worker collects the same items and orders them the same way, before xdist sends the ids on.
    (A worker cannot tell the controller's ``--dist``; the other modes keep their balance under
    any order: each runs all, worksteal moves what waits, loadscope and loadfile group.)"""
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is None:
        return
    if not any(isinstance(item, GateItem) for item in session.items):
        return
    from kvgate.xdist_order import MACHINE_COST, balanced

    def cost(item) -> float:
        if not isinstance(item, GateItem):
            return 1.0
        c = item.case
        return 0.0 if c.error or c.left_out else MACHINE_COST.get(c.machine, 1.0)

    order = balanced([cost(item) for item in session.items], int(workerinput["workercount"]))
    session.items[:] = [session.items[i] for i in order]


def _fuzzing(config: pytest.Config) -> bool:
    """Whether HypoFuzz collects this session (it adds its own collecting plugin)."""
    return any(
        type(p).__module__.startswith("hypofuzz") for p in config.pluginmanager.get_plugins()
    )


def _fuzz_machine(c: Case):
    _kvgate_profiles()
    from kvgate.gate import build_machine
    from kvgate.properties.known import KnownDefects, with_known

    target = with_known(c.target, KnownDefects(c.known)) if c.known else c.target
    machine = build_machine(c.machine, target)

    def __init__(self):  # the signature of the runner's wrapper, annotations too: one digest
        machine.__init__(self)

    # Named as the machine and keyed by its name, as properties/runner.py keys its own run.
    return type(
        machine.__name__,
        (machine,),
        {"__init__": __init__, "_hypothesis_internal_add_digest": machine.__name__.encode()},
    )


# --------------------------------------------------------------------------- running


def run_case(c: Case) -> None:
    """Run the item's machine on its target through the gate's engine (``kvgate.gate``); raise
    ``GateFailure`` with the report on a counterexample or a stale known defect, ``GateError``
    on a target that cannot be checked. A pass prints its line (pytest shows it with -rP)."""
    if c.error:
        raise GateError(f"kvgate: {c.error}")
    from kvgate.gate import KeepProfile, run_one
    from kvgate.gate.text import failure_lines, run_lines
    from kvgate.properties.runner import PROFILE_DATABASE

    try:
        database = _open_database(c.database) if c.database else PROFILE_DATABASE
    except Exception as exc:  # a UsageError: the folder cannot be made, Redis cannot be reached
        raise GateError(f"kvgate: {one_line_of(exc)}") from None
    with _KvgateProfiles(), KeepProfile():
        run = run_one(
            c.machine,
            c.target,
            c.profile,
            c.seed,
            c.max_examples,
            c.steps,
            database,
            known=c.known,
        )
    lines = run_lines(run)
    for line in lines:  # the run line and its known defects, for the JUnit report
        c.properties.append(("kvgate", line.strip()))
    if run.status == "ERROR":
        raise GateError(f"kvgate: {run.name}: {run.target_error}")
    if run.status == "FAIL":
        lines += failure_lines(run)
    lines.append(f"repro: {c.repro()}")
    c.properties.append(("kvgate-repro", c.repro()))  # the line that repeats it, in JUnit
    text = "\n".join(lines)
    if run.status == "FAIL":
        raise GateFailure(text)
    print(text)
