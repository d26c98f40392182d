"""Symbolic checks of the admission rule: the steps ``crosshair diffbehavior`` compares, the
known-bad step, a runner for CrossHair's commands, and PEP 316 contracts on concrete inputs.

``tracker_step`` is impl's ``AdmissionTracker`` as a pure step with the model's signature.
``every_offer_counts_step`` is impl's tracker with the request's ``counted`` record ignored, so
that every offer counts (``mutants.EveryOfferCounts`` at the admission level);
``old_reentry_small`` is the first spec's re-entry rule (``mutants.DroppedKeyNotRetracked``).

``diffbehavior`` honours no ``pre:`` and makes each argument concrete before the call, so on
the steps' own signatures it spends its time on states no manager can be in (an unbounded
tracker, ``max_tracker_size=0``) and almost never picks the same key twice. The ``*_small``
steps take keys from ``Key`` and small numbers from ``Small`` instead, and ``small_state`` maps
any such input onto a valid state (distinct keys, counts >= 1, at most ``max_tracker_size``
of them, no tracker below threshold 2, offers of at most 3 keys), so no search path is wasted.
"""

from __future__ import annotations

import enum
import inspect
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvgate.impl.tracker import AdmissionTracker
from kvgate.model import admission as model_admission
from kvgate.model.admission import Tracker

Step = tuple[Tracker, frozenset[bytes], frozenset[bytes], tuple[bytes, ...], int]


def tracker_step(
    tracker: Tracker,
    counted: frozenset[bytes],
    skipped: frozenset[bytes],
    offer: tuple[bytes, ...],
    resident: frozenset[bytes],
    threshold: int,
    max_tracker_size: int,
    tracker_cls: type = AdmissionTracker,
) -> Step:
    """impl's ``AdmissionTracker`` (or a variant's) as a pure step with the model's signature:
    plain values in, plain values out, no argument mutated."""
    offer_keys = list(dict.fromkeys(offer))
    if threshold < 2:
        admitted = tuple(k for k in offer_keys if k not in resident)
        return tracker, counted, skipped, admitted, 0
    t = tracker_cls(threshold, max_tracker_size)
    t.counts.update(tracker)
    c, s = set(counted), set(skipped)
    admitted, new_skips = t.admit(offer_keys, c, s, resident.__contains__)
    return tuple(t.counts.items()), frozenset(c), frozenset(s), tuple(admitted), new_skips


class _EveryOfferCountsTracker(AdmissionTracker):
    """impl's tracker, told that the request has counted nothing yet; its record still grows."""

    def admit(self, offer, counted, skipped, is_resident):
        fresh = set()  # the keys this offer counts, as if the request had counted none
        out = super().admit(offer, fresh, skipped, is_resident)
        counted |= fresh
        return out


def every_offer_counts_step(*args: *StepArgs) -> Step:
    """impl's step on the tracker that counts every offer (``tracker_step``'s arguments)."""
    return tracker_step(*args, tracker_cls=_EveryOfferCountsTracker)


class Key(enum.Enum):
    A = b"a"
    B = b"b"
    C = b"c"

    def __repr__(self) -> str:
        return f"Key.{self.name}"


class Small(enum.IntEnum):
    ZERO = 0
    ONE = 1
    TWO = 2
    THREE = 3

    def __repr__(self) -> str:
        return f"Small.{self.name}"


SmallTracker = tuple[tuple[Key, Small], ...]
# A step's arguments, tracker_step's order: tracker, counted, skipped, offer, resident,
# threshold, max_tracker_size.
StepArgs = tuple[
    Tracker, frozenset[bytes], frozenset[bytes], tuple[bytes, ...], frozenset[bytes], int, int
]


def small_state(
    tracker: SmallTracker,
    counted: frozenset[Key],
    skipped: frozenset[Key],
    offer: tuple[Key, ...],
    resident: frozenset[Key],
    threshold: Small,
    max_tracker_size: Small,
) -> StepArgs:
    """The step's arguments for a small input: a key listed twice keeps its last place and
    count, count 0 means untracked, the most recent ``max_tracker_size`` keys stay."""
    t, size = int(threshold), max(1, int(max_tracker_size))
    pairs = dict((k.value, int(n)) for k, n in tracker if n) if t >= 2 else {}

    def keys(chosen) -> frozenset:
        return frozenset(k.value for k in chosen)

    return (
        tuple(pairs.items())[-size:],
        keys(counted),
        keys(skipped),
        tuple(k.value for k in offer[:3]),
        keys(resident),
        t,
        size,
    )


SMALL_SIGNATURE = inspect.signature(small_state).replace(return_annotation="Step")


def _on_small(fn: Callable[..., Step]) -> Callable[..., Step]:
    """``fn`` takes ``small_state``'s arguments: its signature and types, which CrossHair reads.
    Each such step is a function of its own (CrossHair's search follows each one's code)."""
    fn.__annotations__ = {**small_state.__annotations__, "return": "Step"}
    fn.__signature__ = SMALL_SIGNATURE  # type: ignore[attr-defined]
    return fn


@_on_small
def model_small(*args) -> Step:
    return model_admission.admission_step(*small_state(*args))


@_on_small
def impl_small(*args) -> Step:
    return tracker_step(*small_state(*args))


@_on_small
def every_offer_counts_small(*args) -> Step:
    return every_offer_counts_step(*small_state(*args))


@_on_small
def old_reentry_small(*args) -> Step:
    """The first spec's re-entry rule (``mutants.DroppedKeyNotRetracked``'s tracker): a key the
    request counted is not tracked again once dropped. The spec A2 ``post:`` refuses it."""
    from kvgate.properties.catalogue.managers import OldReentryTracker

    return tracker_step(*small_state(*args), tracker_cls=OldReentryTracker)


# ---- CrossHair's commands, with their bounds (tests/test_crosshair.py runs them)


def check_command(*targets: str, timeout: float) -> list[str]:
    """``crosshair check``: every ``post:`` gets ``timeout`` CPU seconds."""
    return [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        *targets,
        "--per_condition_timeout",
        str(timeout),
    ]


def diff_command(fn1: str, fn2: str, timeout: float) -> list[str]:
    """``crosshair diffbehavior``: ``timeout`` CPU seconds, half for each order of the two."""
    return [
        sys.executable,
        "-m",
        "crosshair",
        "diffbehavior",
        fn1,
        fn2,
        "--per_condition_timeout",
        str(timeout),
    ]


@dataclass
class Outcome:
    returncode: int
    output: str
    seconds: float


def run(command: list[str], wall_limit: float = 170.0) -> Outcome:
    """Run one CrossHair command from the repository root. Its bounds are CPU time;
    ``wall_limit`` is a backstop."""
    start = time.monotonic()
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=wall_limit,
        cwd=Path(__file__).resolve().parents[2],
    )
    return Outcome(done.returncode, done.stdout + done.stderr, time.monotonic() - start)


def given_lines(output: str) -> list[tuple]:
    """The inputs of the differences ``diffbehavior`` reported on ``*_small`` steps."""
    names = {"Key": Key, "Small": Small, "frozenset": frozenset}
    return [
        tuple(eval(f"dict{line[len('Given: ') :].rstrip(',')}", names).values())
        for line in output.splitlines()
        if line.startswith("Given: ")
    ]


# ---- PEP 316 contracts on concrete inputs (for the Hypothesis tests)


def contract(fn) -> tuple[list[str], list[str]]:
    """``fn``'s ``pre:`` and ``post:`` expressions, one a line as CrossHair reads them."""
    pre: list[str] = []
    post: list[str] = []
    for line in (fn.__doc__ or "").splitlines():
        kind, _, expr = line.strip().partition(": ")
        if kind in ("pre", "post"):
            (pre if kind == "pre" else post).append(expr)
    return pre, post


def call_checked(fn, *args):
    """``fn(*args)`` with its contract evaluated: ``AssertionError`` if a ``pre:`` or a
    ``post:`` does not hold (the caller draws inputs that meet the ``pre:``)."""
    return call_checked_on(fn, fn(*args), *args)


def call_checked_on(fn, result, *args):
    """``fn``'s contract evaluated on ``args`` and a given ``result`` (``fn``'s own, or another
    step's answer to the same arguments, to show that the contract refuses it)."""
    pre, post = contract(fn)
    bound = inspect.signature(fn).bind(*args)
    bound.apply_defaults()  # a contract may name a parameter left at its default (``count``)
    env = {**fn.__globals__, **bound.arguments}
    for expr in pre:
        assert eval(expr, env), f"{fn.__name__}{args}: pre: {expr}"
    env["__return__"] = result
    for expr in post:
        assert eval(expr, env), f"{fn.__name__}{args} = {result}: post: {expr}"
    return result
