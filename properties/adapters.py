"""What every target is made of: the ``Target`` record, the native adapter, the one error.

Adapters are the only place where a manager's answers are normalised. Every adapter answers in
kvgate's own plain values (``impl/base.py``), which equal the reference model's: lookups as
``LookupResult`` (a str enum: ``"MISS" | "HIT" | "HIT_PENDING"``), ``prepare_load`` as a list of
chunk ids, ``prepare_store`` as ``None`` or ``PrepareStoreOutput(keys_to_store, chunk_ids,
evicted_keys)`` of plain lists, events as ``OffloadingEvent(keys, removed, metadata_only)``
tuples, stats as a metric-name dict.

Capabilities: ``Target.missing`` (and the adapter's ``missing``) names the optional calls the
manager lacks (``"touch"``); machines never draw a step that needs one, and the oracle does not
call it on either side. ``Target.note`` is one line for the report (for vLLM: its version and
what the adapter found missing).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.impl.base import LookupResult, OffloadingEvent, PrepareStoreOutput, ReqContext

POLICIES = ("lru", "arc")
# The calls every manager must have, and the ones it may lack (vLLM 0.34.0 removed touch: its
# policies learn recency from loads, stores and on_request_access).
REQUIRED_CALLS = ("lookup", "prepare_load", "complete_load", "prepare_store", "complete_store",
                  "reset_cache", "take_events", "get_stats")
OPTIONAL_CALLS = ("touch",)


class TargetError(Exception):
    """A target that cannot be resolved, imported or built (the CLI exits 2)."""


class RequestHooks:
    """The request-lifecycle calls, which a manager may leave out (they default to nothing)."""

    manager: object

    def on_new_request(self, ctx) -> None:
        hook = getattr(self.manager, "on_new_request", None)
        if hook:
            hook(ctx)

    def on_request_finished(self, ctx) -> None:
        hook = getattr(self.manager, "on_request_finished", None)
        if hook:
            hook(ctx)


def missing_calls(manager_or_class) -> frozenset[str]:
    """The optional calls a manager (or its class) lacks."""
    return frozenset(n for n in OPTIONAL_CALLS
                     if not callable(getattr(manager_or_class, n, None)))


def check_interface(manager_or_class, interface: str) -> frozenset[str]:
    """``TargetError`` (one line) when a required call is missing; else the optional calls
    that are."""
    lacking = [n for n in REQUIRED_CALLS if not callable(getattr(manager_or_class, n, None))]
    if lacking:
        name = getattr(manager_or_class, "__name__", type(manager_or_class).__name__)
        raise TargetError(f"{name} lacks {interface}: missing {', '.join(lacking)}")
    return missing_calls(manager_or_class)


class CapabilityAdapter(RequestHooks):
    """What every adapter does with the calls a manager may lack: names them in ``missing``
    (the oracle and the scheduler never send them) and refuses a direct call in one line."""

    INTERFACE = "the manager interface"

    def __init__(self, manager):
        self.missing = check_interface(manager, self.INTERFACE)
        self.manager = manager

    def _lacks(self, call: str) -> None:
        if call in self.missing:
            raise TargetError(f"{type(self.manager).__name__} has no {call}")


class NativeAdapter(CapabilityAdapter):
    """A manager that follows kvgate's own interface (impl/base.py)."""

    def new_context(self, req_id: str):
        return ReqContext(req_id)

    @staticmethod
    def set_position(ctx, key: bytes, position: int) -> None:
        ctx.set_offload_key_position(key, position)

    @staticmethod
    def position(ctx, key: bytes) -> int | None:
        return ctx.get_offload_key_position(key)

    def lookup(self, key: bytes, ctx=None) -> LookupResult:
        result = self.manager.lookup(key, ctx)
        return LookupResult(getattr(result, "name", result))

    def prepare_load(self, keys, ctx=None) -> list[int]:
        return [int(i) for i in self.manager.prepare_load(list(keys), ctx)]

    def complete_load(self, keys, ctx=None) -> None:
        self.manager.complete_load(list(keys), ctx)

    def touch(self, keys, ctx=None) -> None:
        self._lacks("touch")
        self.manager.touch(list(keys), ctx)

    def prepare_store(self, keys, ctx):
        out = self.manager.prepare_store(list(keys), ctx)
        if out is None:
            return None
        return PrepareStoreOutput(list(out.keys_to_store), [int(i) for i in out.store_spec],
                                  list(out.evicted_keys))

    def complete_store(self, keys, ctx=None, success: bool = True) -> None:
        self.manager.complete_store(list(keys), ctx, success=success)

    def reset_cache(self) -> None:
        self.manager.reset_cache()

    def take_events(self) -> list[OffloadingEvent]:
        return [OffloadingEvent(tuple(e.keys), bool(e.removed), bool(e.metadata_only))
                for e in self.manager.take_events()]

    def get_stats(self) -> dict:
        stats = self.manager.get_stats()
        return stats.as_dict() if hasattr(stats, "as_dict") else dict(stats)

    def tracker_items(self) -> list[tuple[bytes, int]] | None:
        tracker = getattr(self.manager, "tracker", None)
        return None if tracker is None else list(tracker.counts.items())

    def free_chunks(self) -> int | None:
        return getattr(self.manager, "free_chunks", None)

    def policy_state(self) -> dict | None:
        fn = getattr(self.manager, "policy_state", None)
        return fn() if callable(fn) else None

    def chunk_of(self, key: bytes) -> int | None:
        return self.manager.chunk_of(key) if hasattr(self.manager, "chunk_of") else None


Factory = Callable[..., object]  # (num_chunks, cache_policy, store_threshold, max_tracker_size)


@dataclass(frozen=True)
class Target:
    """A resolved target: how to build one adapter per configuration, and how to judge it."""

    spec: str
    factory: Factory
    policies: tuple[str, ...] = POLICIES
    foreign: bool = False  # eviction and chunk-id choices are checked for legality, then adopted
    adapter: type = NativeAdapter
    missing: frozenset[str] = frozenset()  # optional calls the manager lacks ("touch")
    note: str = ""  # one line for the report: what was found (a version, what is missing)

    def make(self, num_chunks: int, cache_policy: str, store_threshold: int,
             max_tracker_size: int):
        try:
            manager = self.factory(num_chunks, cache_policy=cache_policy,
                                   store_threshold=store_threshold,
                                   max_tracker_size=max_tracker_size)
        except TargetError:
            raise
        except Exception as exc:
            raise TargetError(f"target {self.spec!r} could not be built: {exc}") from exc
        return self.adapter(manager)


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
