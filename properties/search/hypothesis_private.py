"""Every private Hypothesis API kvgate uses, in one place: what each is, why kvgate uses it, and
what happens on a Hypothesis without it.

Nothing else in kvgate reaches into Hypothesis's internals; the rule choice
(``properties.search.rule_choice``), the runner (``properties.runner``), the profiles
(``properties.profiles``) and the bug-finding bench call the functions below. ``problems()``
lists what this Hypothesis lacks of them, or has in another shape; tests/test_hypothesis_private.py
fails on any, naming the installed version and ``CHECKED_WITH``, so that an upgrade that changes
one is seen at once rather than as a machine that got slower, examples that differ, or a
counterexample that stopped shrinking.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from hypothesis import strategies as st

# The version whose internals the functions below were written against (constraints.txt pins it).
CHECKED_WITH = "6.170.17"

# --------------------------------------------------------------------------- rule choice
# properties.search.rule_choice replaces a machine's rule strategy with one that evaluates the
# preconditions once and draws the step with one integer (a third of a manager-machine step's
# time goes to Hypothesis's rejection of disabled rules). Without these, machines keep
# Hypothesis's own strategy: the same rules, slower, no weights and no swarm.

_RuleStrategy: Any
try:  # the per-class rule table that Hypothesis's rule strategy builds (private method)
    from hypothesis.stateful import RuleStrategy as _RuleStrategy
except ImportError:  # pragma: no cover - a Hypothesis without it
    _RuleStrategy = None

# A strategy of our own: a subclass of SearchStrategy with do_draw(data) (the public class, but
# subclassing it and drawing from ``data`` is Hypothesis's internal contract).
SearchStrategy = st.SearchStrategy


def machine_rules(machine_cls: type) -> list[Any]:
    """The ``Rule`` objects of a machine class (``RuleStrategy._setup_for``), each with
    ``function``, ``bundles``, ``preconditions`` and ``arguments_strategies``."""
    return list(_RuleStrategy._setup_for(machine_cls)[0])


def rule_name(rule: Any) -> str:
    return rule.function.__name__


def rule_ready(machine: Any, rule: Any) -> bool:
    """Whether ``rule`` may run now: every bundle it draws from holds a value (the machine's
    ``bundles``) and every precondition holds."""
    return all(machine.bundles.get(b.name) for b in rule.bundles) and all(
        p(machine) for p in rule.preconditions
    )


def rule_arguments(rule: Any) -> dict[str, Any]:
    return dict(rule.arguments_strategies)


def draw_integer(data: Any, low: int, high: int) -> int:
    """One integer in ``[low, high]`` from the test case's data, shrinking towards ``low``."""
    return data.draw_integer(low, high)


def can_replace_rule_strategy(machine: Any) -> bool:
    return (
        _RuleStrategy is not None
        and hasattr(_RuleStrategy, "_setup_for")
        and hasattr(machine, "_rules_strategy")
    )


def replace_rule_strategy(machine: Any, strategy: Any) -> None:
    """Where a machine instance keeps the strategy its steps are drawn from."""
    machine._rules_strategy = strategy


def rule_strategy(machine: Any) -> Any:
    return getattr(machine, "_rules_strategy", None)


# --------------------------------------------------------------------------- the runner
# properties.runner wraps a machine class in a subclass that counts examples and steps.


def key_by_name(machine_cls: type, name: str) -> None:
    """Derandomized runs and the example database key a test on a digest of its source; the
    wrapper's source is the same for every machine, so the digest is made from the machine's
    name instead (one per machine and target). Without it every machine would share one key."""
    # an attribute Hypothesis reads off a test, which mypy does not know of on a class
    machine_cls._hypothesis_internal_add_digest = name.encode()  # type: ignore[attr-defined]


def is_step_rule(fn: Any) -> bool:
    """A ``@rule`` method that is not an ``@initialize`` one (the marks the decorators leave),
    so that a counterexample's length counts its steps, not its set-up."""
    return (
        getattr(fn, "hypothesis_stateful_rule", None) is not None
        and getattr(fn, "hypothesis_stateful_initialize_rule", None) is None
    )


def collect_statistics(receive: Callable[[dict], None]) -> contextlib.AbstractContextManager:
    """Hypothesis's per-run statistics (test cases per phase and status), which
    ``hypothesis.statistics.collector`` hands to ``receive`` as a dict: the runs' "new / from
    the database / invalid / while shrinking" figures."""
    from hypothesis.statistics import collector

    # Hypothesis types the collector by its default (None); what it holds is a callback
    return collector.with_value(receive)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- profiles


def stop_local_constants() -> bool:
    """Hypothesis biases draws with constants it reads from the project's loaded modules, so a
    derandomized run would draw other examples whenever a literal changes anywhere in the tree
    or a test process imports other modules; kvgate's verdicts must not depend on that, so the
    pool stays empty (the constants Hypothesis ships with still apply). False where this
    Hypothesis has no such pool (then there is nothing to stop)."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover
        return False
    if not (hasattr(providers, "_get_local_constants") and hasattr(providers, "_local_constants")):
        return False
    providers._get_local_constants = lambda: providers._local_constants
    return True


def local_constants() -> Any:
    """The pool of source constants draws are biased with now (empty once stopped)."""
    from hypothesis.internal.conjecture import providers

    return providers._get_local_constants()


# --------------------------------------------------------------------------- bench


@contextlib.contextmanager
def shrinking_deadline(seconds: float | None) -> Iterator[list[str]]:
    """Lower Hypothesis's shrinking deadline (``engine.MAX_SHRINKING_SECONDS``, five minutes)
    for the block, and keep its reports (the "stopped shrinking" warning) out of the output
    (``hypothesis.reporting.with_reporter``); yields the list that receives them. The bug-finding
    bench uses it to bound a table row's time."""
    from hypothesis.internal.conjecture import engine
    from hypothesis.reporting import with_reporter

    notes: list[str] = []
    saved = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if seconds is not None and saved is not None:
        # typed int by Hypothesis, but only ever added to time.perf_counter(): a float works
        engine.MAX_SHRINKING_SECONDS = seconds  # type: ignore[assignment]
    try:
        with with_reporter(lambda text: notes.append(str(text))):
            yield notes
    finally:
        if saved is not None:
            engine.MAX_SHRINKING_SECONDS = saved


def mark_unshrunk(database: Any) -> None:
    """Move the failing examples an in-memory database saved to their keys' secondary corpus.
    Hypothesis takes an example under the primary key for one it shrank already, and does not
    shrink it again; the secondary corpus (``<key>.secondary``) is where it keeps failing
    examples that were not shrunk. The bug-finding bench shrinks, in a second run, the failure
    its first run found."""
    for key in [k for k in database.data if not k.endswith((b".secondary", b".pareto"))]:
        for value in list(database.fetch(key)):
            database.move(key, key + b".secondary", value)


# --------------------------------------------------------------------------- the check


def problems() -> list[str]:
    """What this Hypothesis lacks of the APIs above, or has in another shape (empty: all as
    kvgate uses them). Checked on a two-rule machine where it can be, by looking otherwise."""
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

    class Probe(RuleBasedStateMachine):
        @initialize()
        def set_up(self):
            pass

        @rule(n=st.integers(0, 1))
        def step(self, n):
            pass

    out = []
    try:
        rules = machine_rules(Probe)
        if (
            [rule_name(r) for r in rules] != ["step"]
            or list(rule_arguments(rules[0])) != ["n"]
            or not rule_ready(Probe(), rules[0])
        ):
            out.append(
                "RuleStrategy._setup_for's rules are not (function, bundles, "
                "preconditions, arguments_strategies) as kvgate reads them (rule choice)"
            )
        if not can_replace_rule_strategy(Probe()):
            out.append("a machine keeps no _rules_strategy to replace (rule choice)")
    except Exception as exc:  # any error here is the changed API, named below
        out.append(
            f"RuleStrategy._setup_for, its Rule objects or a machine's rule strategy "
            f"changed: {type(exc).__name__}: {exc} (rule choice)"
        )
    from hypothesis.internal.conjecture.data import ConjectureData

    params = list(inspect.signature(ConjectureData.draw_integer).parameters)[1:3]
    if params != ["min_value", "max_value"]:
        out.append(
            f"ConjectureData.draw_integer takes {params}, not (min_value, max_value) (rule choice)"
        )
    if not hasattr(SearchStrategy, "do_draw"):
        out.append("SearchStrategy has no do_draw (rule choice)")
    from hypothesis.internal.reflection import function_digest

    twins = [type("Twin", (), {}) for _ in range(2)]
    key_by_name(twins[0], "one")
    key_by_name(twins[1], "two")
    if function_digest(twins[0]) == function_digest(twins[1]):
        out.append(
            "_hypothesis_internal_add_digest no longer enters a test's digest (runner: "
            "database and derandomization keys)"
        )
    if not is_step_rule(Probe.step) or is_step_rule(Probe.set_up):
        out.append(
            "the hypothesis_stateful_rule / _initialize_rule marks changed (runner: step counts)"
        )
    try:
        with collect_statistics(lambda stats: None):
            pass
    except (ImportError, AttributeError) as exc:
        out.append(f"hypothesis.statistics.collector changed: {exc!r} (runner: phase figures)")
    from hypothesis.internal.conjecture import providers

    if not (hasattr(providers, "_get_local_constants") and hasattr(providers, "_local_constants")):
        out.append(
            "providers._get_local_constants/_local_constants are gone (profiles: the "
            "source-constant pool would stay on)"
        )
    from hypothesis.internal.conjecture import engine

    if not isinstance(getattr(engine, "MAX_SHRINKING_SECONDS", None), (int, float)):
        out.append("engine.MAX_SHRINKING_SECONDS is gone (bench: shrinking deadline)")
    try:
        from hypothesis.reporting import with_reporter  # noqa: F401 - checked by importing
    except ImportError:
        out.append("hypothesis.reporting.with_reporter is gone (bench: quiet shrinking)")
    from hypothesis.database import InMemoryExampleDatabase
    from hypothesis.internal.conjecture.engine import ConjectureRunner

    runner = ConjectureRunner(lambda data: None, database_key=b"k")
    if (
        not isinstance(getattr(InMemoryExampleDatabase(), "data", None), dict)
        or getattr(runner, "secondary_key", None) != b"k.secondary"
    ):
        out.append(
            "the in-memory database's data or the .secondary corpus changed (bench: "
            "shrinking a saved failure)"
        )
    return out


# --------------------------------------------------------------------------- HypoFuzz


def let_hypofuzz_save_shrunk_failures() -> None:
    """HypoFuzz (25.11.1, the newest release) copies a shrunk failure's ``slice_comments``,
    which this Hypothesis calls ``span_comments``: without the old name a campaign that finds a
    failure crashes before it saves it. The old name, read-only, for the new one; called only
    in a process HypoFuzz collects (kvgate/pytest_plugin.py, docs/fuzzing.md)."""
    from hypothesis.internal.conjecture.data import ConjectureResult

    if not hasattr(ConjectureResult, "slice_comments"):
        ConjectureResult.slice_comments = property(lambda self: self.span_comments)  # type: ignore[attr-defined]
