"""Known defects: what a gate may leave uncompared because its maintainers already know the
target gets it wrong, and how every run shows that each declaration is still true.

A declaration names one thing the oracle compares that nothing else in the run stands on:

- a **metric** of ``get_stats()`` (``vllm:kv_offload_stores_skipped`` for vLLM 0.34.0): its
  value is read and compared, never fed back into a step;
- an **event field**: ``event.removal_expected`` or ``event.request`` (the request a store
  event names); the events' keys and kinds are the ready keys a consumer replays, so they are
  not declarable;
- an **interface answer**: ``on_new_request``, ``get_load_source``, ``config_info`` or
  ``has_pending_work``.

The admission rule and what rests on it (the admitted keys, lookups, the tracker, chunk ids,
evictions, the policy's order, the pool, the events' keys) cannot be declared: every later step
of a run is built on them, so a run that left one uncompared would check nothing after it.

Strict, like ``xfail(strict=True)``: the oracle counts each time a declared thing differs
(``KnownDefects.saw``); a run that declared a defect and never saw it fails, so that a
declaration cannot outlive the fix. A run that fails on something else first says the known
defect was not reached, and fails on that.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvgate.impl.base import STORES_SKIPPED

from .adapters import Target

METRICS = (
    STORES_SKIPPED,
    "vllm:kv_offload_cpu_allocation_size",
    "vllm:kv_offload_cpu_cache_usage_perc",
    "vllm:kv_offload_cpu_cache_write_usage_perc",
    "vllm:kv_offload_cpu_cache_read_usage_perc",
)
EVENT_FIELDS = ("event.removal_expected", "event.request")
ANSWERS = ("on_new_request", "get_load_source", "config_info", "has_pending_work")
DECLARABLE = METRICS + EVENT_FIELDS + ANSWERS

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
    "get_stats": "name the metric instead (a get_stats() that returns nothing hides them all)",
}


class KnownDefectError(ValueError):
    """A declaration that names nothing declarable (the command line exits 2 on it)."""


def check_declarations(names: Iterable[str]) -> tuple[str, ...]:
    """The declared names, each one checked; ``KnownDefectError`` (one line) for the first that
    names the admission rule or what rests on it, or nothing kvgate compares."""
    out = []
    for raw in names:
        name = str(raw).strip()
        if name in DECLARABLE:
            out.append(name)
            continue
        if name.lower() in FOUNDATIONS:
            raise KnownDefectError(
                f"known defect {name!r} cannot be declared: {FOUNDATIONS[name.lower()]}; "
                "only a metric, an event field or an interface answer can be"
            )
        raise KnownDefectError(
            f"known defect {name!r} is not something kvgate compares; declarable: "
            f"{', '.join(DECLARABLE)}"
        )
    return tuple(dict.fromkeys(out))


@dataclass
class KnownDefects:
    """The declarations of one run and what the run saw of each: how many times the declared
    thing differed, and the first difference (target's answer, model's answer)."""

    declared: tuple[str, ...]
    seen: Counter = field(default_factory=Counter)
    first: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.declared

    def saw(self, name: str, target: Any, model: Any) -> None:
        """The oracle found ``name`` differing, and compared nothing of it."""
        self.seen[name] += 1
        self.first.setdefault(name, (target, model))

    def unseen(self) -> list[str]:
        return [name for name in self.declared if not self.seen[name]]

    def lines(self, passed: bool) -> list[str]:
        """One line per declaration for a report: still present (how often, the first
        difference), gone (the run fails), or not reached (the run failed on something else)."""
        out = []
        for name in self.declared:
            n = self.seen[name]
            if n:
                t, m = self.first[name]
                out.append(
                    f"known defect {name}: still present ({n} differing answer"
                    f"{'s' * (n != 1)} not compared; the first: target {t}, model {m})"
                )
            elif passed:
                out.append(f"known defect {name}: {GONE}")
            else:
                out.append(
                    f"known defect {name}: not reached before the counterexample (the run "
                    "failed on something else)"
                )
        return out


GONE = (
    "declared but it did not occur in this run: it no longer reproduces, so the run fails; "
    "remove the declaration"
)


class KnownDefectGone(AssertionError):
    """A declared known defect that a passing run never saw (strict)."""


def gone_error(known: KnownDefects) -> KnownDefectGone | None:
    """The failure of a passing run whose declarations were not all seen, or None."""
    gone = known.unseen()
    if not gone:
        return None
    return KnownDefectGone(
        f"known defect{'s' * (len(gone) > 1)} {', '.join(gone)} {GONE} (the declaration "
        "cannot outlive the fix)"
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
