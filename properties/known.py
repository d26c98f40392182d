"""Known defects: what a gate may leave uncompared because its maintainers already know the
target gets it wrong, each declared by what it is and judged by its witness.

A declaration names a defect of the catalogue below (``CATALOGUE``): what it breaks (one metric
of ``get_stats()``), in which direction (the target's value below the model's, or above it),
the rule it breaks, and its **witness**: the smallest scripted case of that rule, run through
the lockstep oracle against the model (the style of docs/make_releases.py's witnesses). It is
named by its catalogue name (``skip-undercount``), by ``METRIC:under`` / ``METRIC:over``, or by
the bare metric (``vllm:kv_offload_stores_skipped``: the defect the current releases have,
0.34.0's undercount, spec A5).

- **What it hides**: only a difference of that metric in that direction. The same metric
  differing the other way (0.33.0's overcount where 0.34.0's undercount is declared), or going
  missing, is a divergence as before, and so is everything else.
- **Still there, or gone**: decided by running its witness on the target after the machine's
  run, never by whether the run's random search met the defect. A witness that diverges as
  declared: still present, whatever the budget. A witness that agrees with the model: gone, and
  the run fails (strict, like ``xfail(strict=True)``: the pull request that fixes it removes the
  declaration). A witness that diverges some other way fails the run on that.

The admission rule and what rests on it (the admitted keys, lookups, the tracker, chunk ids,
evictions, the policy's order, the pool, the events' keys) cannot be declared: every later step
of a run is built on them, so a run that left one uncompared would check nothing after it. A
defect kvgate has no witness for cannot be declared either: the day it is fixed could not be
told.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kvgate.impl.base import STORES_SKIPPED, make_key

from .adapters import Target

METRICS = (
    STORES_SKIPPED,
    "vllm:kv_offload_cpu_allocation_size",
    "vllm:kv_offload_cpu_cache_usage_perc",
    "vllm:kv_offload_cpu_cache_write_usage_perc",
    "vllm:kv_offload_cpu_cache_read_usage_perc",
)
DIRECTIONS = {"under": "below the model's", "over": "above the model's"}

# What a declaration may not name, each with the reason a user reads.
FOUNDATIONS = {
    "admission": "the admission rule is what the gate checks",
    "admitted keys": "the admission rule is what the gate checks",
    "prepare_store": "its admitted keys are the admission rule the gate checks",
    "lookup": "every later step reads residency",
    "prepare_load": "its chunk ids are what a load reads",
    "tracker": "the tracker's counts are the admission rule's state",
    "chunk ids": "every later store and load reads them",
    "evictions": "every later step reads residency",
    "policy order": "every later eviction follows it",
    "pool": "every later store draws its chunks from it",
    "events": "a consumer replays the events' keys to know what is ready",
    "take_events": "a consumer replays the events' keys to know what is ready",
    "get_stats": "name the defect instead (a get_stats() that returns nothing hides them all)",
}


# --------------------------------------------------------------------------- the witnesses

A, B = make_key(b"A"), make_key(b"B")


class Script:
    """What a witness drives: the oracle over the target and the model, three requests, and
    ``count``: the call that counts a key toward the threshold where the target's tracker counts
    (an offer, or a lookup where it is fed at lookups: spec §3.2)."""

    def __init__(self, oracle: Any, feed: str):
        self.o = oracle
        self.feed = feed
        self.ctx = [oracle.new_context(f"r{i}") for i in range(3)]
        for i, c in enumerate(self.ctx):
            oracle.name(c, f"r{i}")

    def count(self, key: bytes, ctx: Any) -> Any:
        if self.feed == "lookup":
            self.o.lookup(key, ctx)
            return None
        return self.o.prepare_store([key], ctx)


def skips_twice(s: Script) -> None:
    """spec A5: one request offers a cold key twice at threshold 3; its skip counts once."""
    s.o.prepare_store([A], s.ctx[0])
    s.o.prepare_store([A], s.ctx[0])
    s.o.get_stats()


def skip_after_admit(s: Script) -> None:
    """spec A5: a request whose offer had a key admitted (its store then failed, and the
    tracker of one key let the key go) offers it again and is skipped: that first skip counts."""
    s.count(A, s.ctx[1])
    out = s.count(A, s.ctx[0])  # a second request: A reaches 2
    if s.feed == "lookup":
        out = s.o.prepare_store([A], s.ctx[0])
    if out and out[0]:  # admitted, and its store fails: A leaves the cache
        s.o.complete_store(out[0], s.ctx[0], success=False)
    s.count(B, s.ctx[2])  # a tracker of one key lets A go
    s.o.prepare_store([A], s.ctx[0])
    s.o.get_stats()


# --------------------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class KnownDefect:
    """One defect a gate may declare: the metric it breaks and the direction, the rule, what the
    target does, and its witness (run at ``threshold`` with a tracker of ``tracker`` keys)."""

    name: str
    metric: str
    direction: str  # "under": the target's value below the model's; "over": above it
    rule: str
    what: str
    witness: Callable[[Script], None]
    threshold: int
    tracker: int = 64_000
    seen_in: str = ""  # the releases known to have it

    @property
    def breaks(self) -> str:
        return f"{self.metric} {DIRECTIONS[self.direction]}"

    def covers(self, name: str, target: Any, model: Any) -> bool:
        """Whether ``name`` answering ``target`` where the model answers ``model`` is this
        defect: the same metric, differing in the same direction."""
        if name != self.metric:
            return False
        try:
            t, m = float(target), float(model)
        except (TypeError, ValueError):
            return False  # missing, or not a number: not this defect
        return t < m if self.direction == "under" else t > m


CATALOGUE = {
    d.name: d
    for d in (
        KnownDefect(
            "skip-undercount",
            STORES_SKIPPED,
            "under",
            "spec A5: a key's skip counts once per request and generation, at its first skip",
            "a request's first skip of a key its own earlier offer had admitted is not counted",
            skip_after_admit,
            threshold=2,
            tracker=1,
            seen_in="vLLM 0.34.0",
        ),
        KnownDefect(
            "skip-overcount",
            STORES_SKIPPED,
            "over",
            "spec A5: a key's skip counts once per request and generation",
            "every offer's skipped keys are counted again",
            skips_twice,
            threshold=3,
            seen_in="vLLM 0.33.0, 0.28.0",
        ),
    )
}
# Other spellings of a catalogued defect: METRIC:under / METRIC:over, and the bare metric for
# the defect the current release has (docs/adopt.md's line for 0.34.0).
ALIASES = {f"{d.metric}:{d.direction}": d.name for d in CATALOGUE.values()} | {
    STORES_SKIPPED: "skip-undercount"
}


class KnownDefectError(ValueError):
    """A declaration that names nothing declarable (the command line exits 2 on it)."""


def _declarable() -> str:
    return (
        "; ".join(f"{d.name} (or {d.metric}:{d.direction}: {d.breaks})" for d in CATALOGUE.values())
        + f"; {STORES_SKIPPED} alone is skip-undercount"
    )


def defect_named(raw: Any) -> KnownDefect:
    """The catalogued defect a declaration names; ``KnownDefectError`` (one line) otherwise."""
    if not isinstance(raw, str):
        raise KnownDefectError(
            f"known defect {raw!r}: a declaration is a defect's name (a string); declarable: "
            f"{_declarable()}"
        )
    name = raw.strip()
    if name in CATALOGUE:
        return CATALOGUE[name]
    if name in ALIASES:
        return CATALOGUE[ALIASES[name]]
    if name.lower() in FOUNDATIONS:
        raise KnownDefectError(
            f"known defect {name!r} cannot be declared: {FOUNDATIONS[name.lower()]}; "
            f"declarable: {_declarable()}"
        )
    metric, _, direction = name.rpartition(":")
    if name in METRICS or metric in METRICS:
        what = f"{metric} {DIRECTIONS.get(direction, direction)}" if metric in METRICS else name
        raise KnownDefectError(
            f"known defect {name!r}: kvgate knows no defect that leaves {what} and has no "
            f"witness for one, so the day it is fixed could not be told; declarable: "
            f"{_declarable()}"
        )
    raise KnownDefectError(
        f"known defect {name!r} is not a defect kvgate knows (it has a witness for each); "
        f"declarable: {_declarable()}"
    )


def check_declarations(names: Iterable[Any]) -> tuple[str, ...]:
    """The catalogue names of the declared defects, each one checked; ``KnownDefectError``
    (one line) for the first that names the admission rule or what rests on it, or no
    catalogued defect. A string is one declaration."""
    if isinstance(names, str):
        names = [names]
    try:
        listed = list(names)
    except TypeError:
        raise KnownDefectError(
            f"known defects {names!r}: a list of defect names, such as ['skip-undercount']"
        ) from None
    return tuple(dict.fromkeys(defect_named(n).name for n in listed))


# --------------------------------------------------------------------------- one run's record


@dataclass
class Witnessed:
    """What a defect's witness did on the target: ``present`` True (it diverges as declared:
    ``first`` is (target, model)), False (it agrees with the model: gone), or None (it could not
    run: ``line`` says why); ``other``: a divergence of another kind, which fails the run."""

    present: bool | None
    line: str = ""
    first: tuple[Any, Any] | None = None
    other: BaseException | None = None


@dataclass
class KnownDefects:
    """The declarations of one run, what the run's oracle saw of each (how many differing
    answers it left uncompared, the first of them) and what each witness did."""

    declared: tuple[str, ...]
    seen: Counter = field(default_factory=Counter)
    first: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    witnessed: dict[str, Witnessed] = field(default_factory=dict)

    @property
    def defects(self) -> list[KnownDefect]:
        return [CATALOGUE[n] for n in self.declared]

    def __contains__(self, name: str) -> bool:
        """Whether the oracle should ask about ``name``'s differences (``saw``)."""
        return any(d.metric == name for d in self.defects)

    def saw(self, name: str, target: Any, model: Any, oracle: Any = None) -> None:
        """The oracle found ``name`` differing: counted and not compared where it is a declared
        defect; any other difference of it is raised as the divergence it is, through
        ``oracle`` (``LockstepManager.diverge``: it names the step and the call) where given."""
        for d in self.defects:
            if d.covers(name, target, model):
                self.seen[d.name] += 1
                self.first.setdefault(d.name, (target, model))
                return
        raise _divergence(name, target, model, self.defects, oracle)

    def lines(self) -> list[str]:
        """One line per declaration for a report: what its witness did (present, gone, another
        divergence, or not run), and how often the run left it uncompared."""
        out = []
        for d in self.defects:
            w = self.witnessed.get(d.name)
            n = self.seen[d.name]
            met = (
                f"this run met it {n} time{'s' * (n != 1)}, not compared"
                if n
                else "this run did not meet it"
            )
            head = f"known defect {d.name} ({d.breaks})"
            if w is None:
                out.append(f"{head}: its witness was not run ({met})")
            elif w.present:
                t, m = w.first or ("?", "?")
                out.append(
                    f"{head}: still present: its witness diverges as declared (target {t}, "
                    f"model {m}); {met}"
                )
            elif w.present is False and w.other is None:
                out.append(f"{head}: {GONE}")
            elif w.other is not None:
                out.append(f"{head}: its witness diverged otherwise: {w.line}")
            else:
                out.append(f"{head}: not judged: {w.line}")
        return out


GONE = "gone: its witness now agrees with the model, so the run fails; remove the declaration"


class KnownDefectGone(AssertionError):
    """A declared known defect whose witness no longer diverges, or diverges otherwise."""


def _divergence(
    name: str, target: Any, model: Any, defects: list[KnownDefect], oracle: Any
) -> Exception:
    """The divergence of a declared metric that differs otherwise than declared."""
    declared = "; ".join(f"{d.name} ({d.breaks})" for d in defects if d.metric == name)
    shown = f"no {name}" if target == "(missing)" else f"{name}={target}"
    why = f"{name} differs, and not as the declared known defect {declared}"
    if oracle is not None:
        return oracle.diverge("get_stats()", shown, f"{name}={model}", why)
    return AssertionError(
        f"divergence at get_stats(): target {shown}, model {name}={model} ({why})"
    )


def with_known(target: Target, known: KnownDefects) -> Target:
    """``target`` whose adapters carry ``known`` (the oracle reads ``adapter.known``)."""
    build = target.adapter

    def adapter(manager: Any) -> Any:
        made = build(manager)
        made.known = known
        return made

    return dataclasses.replace(target, adapter=adapter)


def known_of(adapter: Any) -> KnownDefects | None:
    """What the oracle consults: the run's declarations, or None where there are none."""
    known = getattr(adapter, "known", None)
    return known if isinstance(known, KnownDefects) and known.declared else None
