"""What every target is made of: the ``Target`` record, the adapter boundary, the one error.

Adapters are the only place where a manager's answers are normalised, and the only way the
oracle reaches a manager. Every adapter answers in kvgate's own plain values (``impl/base.py``),
which equal the reference model's: lookups as ``LookupResult`` (a str enum), ``prepare_load`` as
a list of chunk ids, ``prepare_store`` as ``None`` or ``PrepareStoreOutput(keys_to_store,
chunk_ids, evicted_keys)`` of plain lists, events as ``Event`` tuples, stats as a metric-name
dict (``None`` when the manager returned nothing), and the interface answers as plain strings
and lists. ``raw`` holds the manager's own answer to the latest call, so that a caller that
speaks the manager's interface (vLLM's scheduler) can be handed exactly what it answered.

Inspection (what the oracle compares beyond the answers, for targets checked exactly):
``tracker_items()``, ``policy_state()``, ``free_chunks()`` and ``resident(key)`` -> ``(chunk,
ref)``; ``None`` where the adapter cannot see it.

Capabilities: ``missing`` names the optional calls the manager lacks (machines never draw a
step that needs one, and the oracle calls neither side); ``Target.recencies`` the recency
semantics it can be built with (spec section 4); ``Target.note`` is one line for the report.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import hypothesis

from kvgate.impl.base import (
    ALLOCATION_SIZE,
    CACHE_USAGE,
    READ_USAGE,
    STORES_SKIPPED,
    WRITE_USAGE,
    LookupResult,
    ReqContext,
)

from . import answers
from .answers import BadAnswer as BadAnswer  # defined beside the checks that raise it

POLICIES = ("lru", "arc")
RECENCIES = ("touch", "request")
# The calls every manager must have, and the ones it may lack (vLLM 0.34.0 removed touch: its
# policies learn recency per request).
REQUIRED_CALLS = (
    "lookup",
    "prepare_load",
    "complete_load",
    "prepare_store",
    "complete_store",
    "take_events",
)
# Optional, each found by capability (spec §10): vLLM 0.21.0 has no reset_cache, 0.21.0 to
# 0.23.0 no get_stats; a machine never draws a step that needs a call the target lacks, and the
# report names what that leaves unchecked (``UNCHECKED_WITHOUT``).
OPTIONAL_CALLS = (
    "reset_cache",
    "get_stats",
    "touch",
    "on_new_request",
    "on_request_finished",
    "get_load_source",
    "config_info",
    "has_pending_work",
)
# Properties that need what an adapter of a foreign manager cannot see or fix (spec section 9).
EXACT_ONLY = (
    "chunk ids equal the model's",
    "evicted keys equal the model's",
    "policy order equals the model's",
    "pool accounting",
    "bad input leaves state unchanged",
    "repeated keys in one offer",
)
# Properties of kvgate's own interface (spec section 8) that vLLM's managers do not promise:
# they assert on protocol misuse and do not deduplicate an offer.
KVGATE_INTERFACE_ONLY = ("bad input leaves state unchanged", "repeated keys in one offer")


# What a machine leaves unchecked when a target lacks an optional call (for the report).
UNCHECKED_WITHOUT = {
    "reset_cache": "resets (spec A7, §4.4)",
    "get_stats": "every metric (spec §5.2, §5.3)",
    "touch": "touch-based recency hints",
    "on_new_request": "the offloading policy a request is given",
    "on_request_finished": "request-scoped recency commits",
    "get_load_source": "the load source of a hit",
    "config_info": "config_info",
    "has_pending_work": "has_pending_work",
}


class TargetError(Exception):
    """A target that cannot be resolved or imported, or lacks the interface, or kvgate's own
    code failing on it (the CLI exits 2 with one line: never a verdict)."""


# Where kvgate's own code lives: an exception whose innermost frame outside the standard library
# is here was raised by kvgate, not by the target (spec §9: never a verdict). The catalogue of
# known-bad managers is target code that kvgate ships.
_HERE = Path(__file__).resolve().parent
_HARNESS = tuple(
    str(p) + os.sep
    for p in (
        _HERE,
        _HERE.parent / "model",
        _HERE.parent / "kvgate",
        Path(hypothesis.__file__).parent,
    )
) + (str(_HERE.parent / "impl" / "scheduler.py"),)  # the driver, never a target
_TARGETS_SHIPPED = (str(_HERE / "catalogue") + os.sep,)
_STDLIB = tuple(
    str(Path(sysconfig.get_paths()[k]).resolve()) + os.sep for k in ("stdlib", "platstdlib")
)


def raised_at(exc: BaseException) -> tuple[str, bool]:
    """``("file:line in function", in_harness)`` for the innermost frame of ``exc``'s traceback
    outside the standard library; ``in_harness``: that frame is kvgate's own code."""
    frames = [
        (f.f_code.co_filename, line, f.f_code.co_name)
        for f, line in traceback.walk_tb(exc.__traceback__)
    ]
    for filename, line, func in reversed(frames):
        path = str(Path(filename).resolve())
        if path.startswith(_STDLIB) and "site-packages" not in path:
            continue
        harness = path.startswith(_HARNESS) and not path.startswith(_TARGETS_SHIPPED)
        return f"{_short(path)}:{line} in {func}", harness
    return "(no Python frame)", False


def _short(path: str) -> str:
    """A path as a reader finds it: inside site-packages from there, in this tree relative."""
    if "site-packages" + os.sep in path:
        return path.split("site-packages" + os.sep, 1)[1]
    root = str(_HERE.parent) + os.sep
    return path[len(root) :] if path.startswith(root) else path


def harness_error(exc: BaseException, where: str, during: str, release: str = "") -> TargetError:
    """The one line for an exception raised in kvgate's own code: which release, which call,
    what kvgate raised where, and that nothing past it was checked."""
    text = str(exc).strip().splitlines()
    head = f"{release}: " if release else ""
    return TargetError(
        f"{head}kvgate's own code raised {type(exc).__name__}"
        f"{': ' + text[0] if text else ''} at {where}, during {during}; kvgate checked nothing "
        "past that step (a kvgate bug: no verdict on the target)"
    )


def no_verdict(error: BaseException | None, during: str, release: str = "") -> str:
    """The one line where ``error`` leaves no verdict on the target, ``""`` where it is one
    (or where there is no error): a ``TargetError`` (or an error it caused), or an exception
    raised in kvgate's own code (``harness_error``). A property's failure, an exception raised
    in the target and an ill-formed answer (``BadAnswer``, and whatever kvgate raised after one:
    properties/runner.py hands that over as the answer's divergence) are verdicts."""
    if error is None:
        return ""
    if isinstance(error, TargetError):
        return str(error)
    if isinstance(error.__cause__, TargetError):
        return str(error.__cause__)
    if isinstance(error, (AssertionError, BadAnswer)):
        return ""
    where, harness = raised_at(error)
    return str(harness_error(error, where, during, release)) if harness else ""


class Event(NamedTuple):
    """One event as every adapter reports it. ``removal_expected`` and ``req`` (the context of
    the request whose store it announces) are ``None`` where the manager's events lack them."""

    keys: tuple[bytes, ...]
    removed: bool
    metadata_only: bool = False
    removal_expected: bool | None = None
    req: Any = None


def missing_calls(manager_or_class) -> frozenset[str]:
    """The optional calls a manager (or its class) lacks."""
    return frozenset(n for n in OPTIONAL_CALLS if not callable(getattr(manager_or_class, n, None)))


def check_interface(manager_or_class, interface: str) -> frozenset[str]:
    """``TargetError`` (one line) when a required call is missing; else the optional calls
    that are."""
    lacking = [n for n in REQUIRED_CALLS if not callable(getattr(manager_or_class, n, None))]
    if lacking:
        name = getattr(manager_or_class, "__name__", type(manager_or_class).__name__)
        raise TargetError(f"{name} lacks {interface}: missing {', '.join(lacking)}")
    return missing_calls(manager_or_class)


class Adapter:
    """What every adapter shares: capabilities, the raw answer, and one refusal for a call the
    manager lacks. Subclasses translate keys, contexts and answers."""

    INTERFACE = "the manager interface"

    def __init__(self, manager):
        self.missing = check_interface(manager, self.INTERFACE)
        self.manager = manager
        self.raw: Any = None

    def _lacks(self, call: str) -> None:
        """A call the manager lacks reached the adapter (a machine that does not read
        ``missing``): one line naming the release, the call and what is not checked."""
        if call in self.missing:
            release = getattr(self, "release", "") or type(self.manager).__name__
            raise TargetError(
                f"{release}: {type(self.manager).__name__} has no {call}, which this machine "
                f"needs: nothing is checked here, {UNCHECKED_WITHOUT.get(call, call)} least of "
                f"all (the manager machine checks the rest, drawing no {call})"
            )

    def _call(self, name: str, *args, **kwargs) -> Any:
        self._lacks(name)
        self.raw = getattr(self.manager, name)(*args, **kwargs)
        return self.raw


W = answers.NATIVE  # what each answer must be, in the words of kvgate's interface


class NativeAdapter(Adapter):
    """A manager that follows kvgate's own interface (impl/base.py)."""

    def new_context(self, req_id: str) -> ReqContext:
        return ReqContext(req_id)

    @staticmethod
    def set_position(ctx, key: bytes, position: int) -> None:
        ctx.set_offload_key_position(key, position)

    @staticmethod
    def position(ctx, key: bytes) -> int | None:
        return ctx.get_offload_key_position(key)

    def on_new_request(self, ctx) -> Any:
        return answers.named("on_new_request", self._call("on_new_request", ctx), W["new_request"])

    def on_request_finished(self, ctx) -> None:
        self._call("on_request_finished", ctx)

    def lookup(self, key: bytes, ctx=None) -> LookupResult:
        result = self._call("lookup", key, ctx)
        return LookupResult(answers.named("lookup", result, W["lookup"], LookupResult.__members__))

    def get_load_source(self, key: bytes, ctx=None) -> str:
        return answers.named(
            "get_load_source", self._call("get_load_source", key, ctx), W["load_source"]
        )

    def config_info(self) -> list:
        return answers.config_info("config_info", self._call("config_info"), W["config_info"])

    def has_pending_work(self) -> bool:
        return answers.boolean(
            "has_pending_work", self._call("has_pending_work"), W["has_pending_work"]
        )

    def prepare_load(self, keys, ctx=None) -> list[int]:
        ids = answers.chunk_ids(
            "prepare_load", self._call("prepare_load", list(keys), ctx), W["spec"]
        )
        return [int(i) for i in ids]

    def complete_load(self, keys, ctx=None) -> None:
        self._call("complete_load", list(keys), ctx)

    def touch(self, keys, ctx=None) -> None:
        self._call("touch", list(keys), ctx)

    def prepare_store(self, keys, ctx):
        out = answers.store_output(
            "prepare_store", self._call("prepare_store", list(keys), ctx), W, vllm=False
        )
        if out is None:
            return None
        stored, spec, evicted = out
        return StoreAnswer(stored, [int(i) for i in spec], evicted)

    def complete_store(self, keys, ctx=None, success: bool = True) -> None:
        # a success as a caller writes it: the interface's default (spec section 2)
        extra = {} if success else {"success": False}
        self._call("complete_store", list(keys), ctx, **extra)

    def reset_cache(self) -> None:
        self._call("reset_cache")

    def take_events(self) -> list[Event]:
        return [
            Event(tuple(e.keys), bool(e.removed), bool(getattr(e, "metadata_only", False)))
            for e in answers.events("take_events", self._call("take_events"), W["events"])
        ]

    def get_stats(self) -> dict | None:
        stats = self._call("get_stats")
        if stats is None:
            return None
        raw = stats.as_dict() if hasattr(stats, "as_dict") else stats
        metrics = answers.metrics("get_stats", raw, W["stats"])
        for name in (STORES_SKIPPED, CACHE_USAGE, WRITE_USAGE, READ_USAGE):  # numbers, as read
            answers.metric_value("get_stats", name, metrics.get(name), W["stats"])
        if ALLOCATION_SIZE in metrics:  # the samples: chunk counts
            answers.chunk_ids(
                "get_stats",
                metrics[ALLOCATION_SIZE],
                W["stats"],
                f"stats whose {ALLOCATION_SIZE} is",
            )
        return metrics

    # --- inspection
    def tracker_items(self) -> list[tuple[bytes, int]] | None:
        tracker = getattr(self.manager, "tracker", None)
        return None if tracker is None else list(tracker.counts.items())

    def free_chunks(self) -> int | None:
        return getattr(self.manager, "free_chunks", None)

    def policy_state(self) -> dict | None:
        fn = getattr(self.manager, "policy_state", None)
        return fn() if callable(fn) else None

    def resident(self, key: bytes) -> Residency | None:
        """``(chunk id, ref count)`` of a resident key, ``None`` for an absent one; raises
        ``AttributeError`` when the manager has no inspection helpers."""
        chunk = self.manager.chunk_of(key)
        return None if chunk is None else Residency(chunk, self.manager.ref_count(key))

    def inspectable(self) -> bool:
        return all(callable(getattr(self.manager, n, None)) for n in ("chunk_of", "ref_count"))


Factory = Callable[..., object]  # (num_chunks, cache_policy=, store_threshold=, ...)


class StoreAnswer(NamedTuple):
    """An adapter's answer to ``prepare_store`` that admitted (``None`` when it refused)."""

    keys: list  # the keys to store, in the target's order
    chunk_ids: list[int]  # the chunk each of them goes to
    evicted: list  # the keys evicted to make room


class Residency(NamedTuple):
    """Where a resident key sits (``adapter.resident(key)``)."""

    chunk: int
    ref: int  # the chunk's reference count: loads in flight


@dataclass(frozen=True, kw_only=True)
class Config:
    """One configuration a machine builds a target and a model with."""

    num_chunks: int
    store_threshold: int = 1
    max_tracker_size: int = 64_000
    cache_policy: str = "lru"
    enable_events: bool = True
    recency: str = "touch"
    # the policy named by its class and module (vLLM's out-of-tree way to load a policy,
    # ``cache_policy_module_path``) instead of its registered name; same policy, same model
    policy_by_path: bool = False


def model_for(config: Config, **extra: Any) -> Any:
    """The reference model built as ``config`` says (``extra``: the model's own settings,
    ``slots`` and ``feed``)."""
    from kvgate.model.cache import Model

    return Model(
        config.num_chunks,
        store_threshold=config.store_threshold,
        max_tracker_size=config.max_tracker_size,
        policy=config.cache_policy,
        enable_events=config.enable_events,
        recency=config.recency,
        **extra,
    )


@dataclass(frozen=True)
class Target:
    """A resolved target: how to build one adapter per configuration, and how to judge it."""

    spec: str
    factory: Factory
    policies: tuple[str, ...] = POLICIES
    foreign: bool = False  # eviction and chunk-id choices are checked for legality, then adopted
    adapter: Callable[[Any], Any] = NativeAdapter
    missing: frozenset[str] = frozenset()  # optional calls the manager lacks ("touch")
    note: str = ""  # one line for the report: what was found (a version, what is missing)
    recencies: tuple[str, ...] = ("touch",)  # recency semantics it is built with (spec s4)
    takes_recency: bool = False  # the factory is told the recency (impl); else it is fixed
    # kvgate's interface (spec section 8 applies: bad input is refused and changes nothing, a
    # repeated key in one offer is one offer of it); vLLM's managers use assertions instead
    kvgate_interface: bool = True
    # Where its tracker counts (spec §3.2): "offer" (the seed's place) or "lookup"; learnt from
    # the target by the adapter, never from a version.
    feed: str = "offer"
    # Whether its request contexts hold key positions (spec §1); without them every request is
    # one whose keys have none, and request-scoped recency orders by first sight (spec R3).
    positions: bool = True
    release: str = ""  # which release it is, for the one line of a harness error

    @property
    def takes_policy_path(self) -> bool:
        """Whether its factory can name the policy by module path (vLLM's out-of-tree way)."""
        return factory_takes(self.factory, "policy_by_path")

    def unchecked(self) -> list[str]:
        """What the machines do not check for this target, each with why (for the report)."""
        parts = []
        if self.foreign:
            parts.append(f"{', '.join(EXACT_ONLY)} (an adapter cannot see them)")
        elif not self.kvgate_interface:
            parts.append(f"{', '.join(KVGATE_INTERFACE_ONLY)} (not part of its interface)")
        if self.missing:
            what = [UNCHECKED_WITHOUT.get(n, n) for n in sorted(self.missing)]
            parts.append(
                f"no {', '.join(sorted(self.missing))} steps (the target lacks them), so not "
                f"{', '.join(what)}"
            )
        if not self.positions:
            parts.append(
                "key positions (its request contexts cannot hold them): every request's keys "
                "have none"
            )
        return parts

    def make(self, config: Config):
        """An adapter over a manager built for ``config``; whatever the constructor raises
        propagates (a machine turns it into a counterexample: spec section 9)."""
        kwargs: dict[str, Any] = dict(
            cache_policy=config.cache_policy,
            store_threshold=config.store_threshold,
            max_tracker_size=config.max_tracker_size,
            enable_events=config.enable_events,
        )
        if self.takes_recency:
            kwargs["recency"] = config.recency
        if self.takes_policy_path:
            kwargs["policy_by_path"] = config.policy_by_path
        adapter = self.adapter(self.factory(config.num_chunks, **kwargs))
        adapter.release = self.release or self.spec  # named in a harness error's line
        return adapter


def factory_takes(factory: Factory, name: str) -> bool:
    """Whether a factory takes the optional argument ``name`` (the ones it names in ``TAKES``,
    as ``vllm_adapter.vllm_factory`` gives a class that has them)."""
    return name in getattr(factory, "TAKES", ())


def takes_recency(factory: Factory) -> bool:
    """Whether a kvgate-interface factory can be built under both recency semantics (it takes
    a ``recency`` argument, as impl's manager does)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "recency" in params


def native_target(
    spec: str,
    factory: Factory,
    policies: tuple[str, ...] = POLICIES,
    foreign: bool = False,
    note: str = "",
) -> Target:
    """A kvgate-interface target; a class is checked for the interface here (``TargetError``),
    a factory by what it builds (``check_built``)."""
    if isinstance(factory, type):
        missing = check_interface(factory, Adapter.INTERFACE)
    else:
        try:
            built = factory(4, cache_policy=policies[0], store_threshold=2, max_tracker_size=4)
        except Exception:  # the machines report a constructor that raises (spec section 9)
            missing = frozenset()
        else:
            missing = check_interface(built, Adapter.INTERFACE)
    recencies = RECENCIES if takes_recency(factory) else ("touch",)
    if missing and not note:
        note = f"{spec}: lacks {', '.join(sorted(missing))} (never drawn)"
    return Target(
        spec,
        factory,
        policies,
        foreign=foreign,
        missing=missing,
        note=note,
        recencies=recencies,
        takes_recency=recencies == RECENCIES,
    )


def import_attr(path: str):
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError(f"target {path!r} is not MODULE:ATTR")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise TargetError(f"cannot import {module_name!r} for target {path!r}: {exc}") from exc
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise TargetError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise TargetError(f"target {path!r} is not a class or factory")
    return obj
