"""A stand-in for vLLM's kv_offload interface, so the vLLM adapter is tested without vLLM.

How it works and why: docs/internals.md, section tests/fake_vllm.py.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from kvgate.impl.base import make_key
from kvgate.impl.manager import OffloadingManager
from kvgate.properties.catalogue.managers import EveryOfferCounts


class OffloadKey(NamedTuple):
    block_hash: bytes
    group_idx: int


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    return OffloadKey(bytes(block_hash), group_idx)


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    _state: dict[type, Any] = field(default_factory=dict, repr=False, init=False)
    _positions: dict[Any, int] = field(default_factory=dict, repr=False, init=False)

    def get_state(self, cls):
        return self._state.get(cls)

    def set_state(self, value) -> None:
        self._state[type(value)] = value

    def set_offload_key_position(self, key, end_token: int) -> None:
        self._positions[key] = end_token

    def get_offload_key_position(self, key):
        return self._positions.get(key)


class _Ours:
    """What impl's manager is handed as the context: our keys' positions, the same state."""

    def __init__(self, theirs: ReqContext):
        self.theirs = theirs

    def get_state(self, cls):
        return self.theirs.get_state(cls)

    def set_state(self, value) -> None:
        self.theirs.set_state(value)

    def get_offload_key_position(self, key: bytes):
        return self.theirs.get_offload_key_position(_theirs(key))


class OffloadPolicy(enum.Enum):
    CHUNK_LEVEL = "chunk_level"


@dataclass
class RequestOffloadingContext:
    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class CacheHitSource(enum.Enum):
    HOST = "host"


class LookupResult(enum.Enum):
    MISS = enum.auto()
    HIT = enum.auto()
    HIT_PENDING = enum.auto()


class CPULoadStoreSpec:
    def __init__(self, block_ids):
        self.block_ids = np.array(list(block_ids), dtype=np.int32)


@dataclass
class PrepareStoreOutput:
    keys_to_store: list[OffloadKey]
    store_spec: CPULoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    keys: list[OffloadKey]
    removed: bool
    metadata_only: bool = False
    removal_expected: bool = False  # fields 0.34.0 added: compared where present
    req_context: Any = None


class Stats:
    """Metric name -> {label values: value}, a list of samples for the histogram;
    ``reduce()`` summarises the histogram to a count and a sum, so samples are only in
    ``metric_sections()``."""

    def __init__(self, values: dict[str, Any]):
        self._types = {
            name: "histogram" if isinstance(v, list) else "gauge" for name, v in values.items()
        }
        self._values = {
            name: {(): v} for name, v in values.items() if not (isinstance(v, list) and not v)
        }

    def metric_sections(self):
        return self._types, self._values

    def reduce(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, per_label in self._values.items():
            value = per_label[()]
            if isinstance(value, list):
                out[f"{name}_count"], out[f"{name}_sum"] = len(value), sum(value)
            else:
                out[name] = value
        return out


def _ours(key: OffloadKey) -> bytes:
    return make_key(key.block_hash, key.group_idx)


def _theirs(key: bytes) -> OffloadKey:
    return OffloadKey(key[:-4], int.from_bytes(key[-4:], "big"))


def _ctx(req_context):
    return None if req_context is None else _Ours(req_context)


class _Chunk(NamedTuple):
    chunk_id: int
    ref_cnt: int


class _PolicyView:
    """impl's policy under vLLM's names: ``get(key)`` -> chunk status, the LRU ranks or ARC's
    lists, and the request-scoped hooks (which the adapter reads as the recency semantics)."""

    def __init__(self, manager: OffloadingManager):
        self._m = manager

    def get(self, key):
        entry = self._m._policy.get(_ours(key))
        return None if entry is None else _Chunk(entry.chunk, entry.ref)

    def __getattr__(self, name):
        policy = self._m._policy
        if name == "_ranks" and hasattr(policy, "ranks"):
            return {_theirs(k): r for k, r in policy.ranks.items()}
        if name == "target_t1_size" and hasattr(policy, "p"):
            return policy.p
        if name in ("t1", "t2", "b1", "b2") and hasattr(policy, name):
            return [_theirs(k) for k in getattr(policy, name)]
        if name in ("on_request_access", "on_request_finished"):
            return lambda *args: None  # impl's manager calls its own hooks
        raise AttributeError(name)


class FakeManagerWithoutTouch:
    """impl's manager behind vLLM-shaped types, without ``touch`` (as vLLM 0.34.0 has it)."""

    manager_cls = OffloadingManager

    def __init__(
        self,
        num_blocks: int,
        cache_policy: str = "lru",
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
    ):
        self._m = self.manager_cls(
            num_blocks,
            cache_policy=cache_policy,
            enable_events=enable_events,
            store_threshold=store_threshold,
            max_tracker_size=max_tracker_size,
            recency="request",
        )
        self._num_chunks = num_blocks
        self._policy = _PolicyView(self._m)
        self._stored_by: dict[bytes, list[ReqContext]] = {}  # a key's store events' requests

    @property
    def counts(self) -> OrderedDict | None:
        tracker = self._m.tracker
        if tracker is None:
            return None
        return OrderedDict((_theirs(k), c) for k, c in tracker.counts.items())

    @property
    def _free_list(self) -> list[int]:
        return list(self._m._pool._freed)

    @property
    def _num_allocated_chunks(self) -> int:
        return self._m._pool._next_fresh

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        self._m.on_new_request(_ctx(req_context))
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._m.on_request_finished(_ctx(req_context))

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult[self._m.lookup(_ours(key), _ctx(req_context)).name]

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        return CacheHitSource(self._m.get_load_source(_ours(key), _ctx(req_context)))

    def config_info(self) -> list[dict]:
        return self._m.config_info()

    def has_pending_work(self) -> bool:
        return self._m.has_pending_work()

    def prepare_load(self, keys, req_context: ReqContext) -> CPULoadStoreSpec:
        return CPULoadStoreSpec(self._m.prepare_load([_ours(k) for k in keys], _ctx(req_context)))

    def complete_load(self, keys, req_context: ReqContext) -> None:
        self._m.complete_load([_ours(k) for k in keys], _ctx(req_context))

    def prepare_store(self, keys, req_context: ReqContext) -> PrepareStoreOutput | None:
        out = self._m.prepare_store([_ours(k) for k in keys], _ctx(req_context))
        if out is None:
            return None
        return PrepareStoreOutput(
            [_theirs(k) for k in out.keys_to_store],
            CPULoadStoreSpec(out.store_spec),
            [_theirs(k) for k in out.evicted_keys],
        )

    def complete_store(self, keys, req_context: ReqContext, success: bool = True) -> None:
        ours = [_ours(k) for k in keys]
        for key in ours:  # a store event names the request whose store completed
            if self._m.lookup(key).name == "HIT_PENDING" and success:
                # one entry per store event, in the order the manager queues them
                self._stored_by.setdefault(key, []).append(req_context)
        self._m.complete_store(ours, _ctx(req_context), success=success)

    def reset_cache(self) -> None:
        self._m.reset_cache()

    def take_events(self):
        for event in self._m.take_events():  # runs only once the generator is iterated
            by = None
            if not event.removed:
                named = [q.pop(0) for k in event.keys if (q := self._stored_by.get(k))]
                by = named[0] if named else None
            yield OffloadingEvent(
                [_theirs(k) for k in event.keys],
                event.removed,
                event.metadata_only,
                removal_expected=not event.removed,
                req_context=by,
            )

    def get_stats(self) -> Stats:
        return Stats(self._m.get_stats().as_dict())

    # What vLLM 0.34.0's manager base class gives every manager, and its connector calls
    # unconditionally: nothing to do here.
    def on_schedule_end(self, context) -> None:
        return None

    def on_reset_flushed(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


class FakeManager(FakeManagerWithoutTouch):
    """impl's manager behind vLLM-shaped types (the interface an upstream manager has)."""

    def touch(self, keys, req_context: ReqContext) -> None:
        self._m.touch([_ours(k) for k in keys], _ctx(req_context))


class FakeEveryOfferCounts(FakeManager):
    """The known-bad ``every_offer_counts`` behind the same vLLM-shaped types."""

    manager_cls = EveryOfferCounts


class NotAManager:
    """Builds with any arguments, but has none of a manager's methods."""

    def __init__(self, *args, **kwargs):
        pass


class FakeStoreEventWithoutRequest(FakeManagerWithoutTouch):
    """Its store events name no request (0.34.0's name the request whose store completed)."""

    def take_events(self):
        for event in super().take_events():
            event.req_context = None
            yield event


class ImplWithoutTouch(OffloadingManager):
    """impl's manager with no touch: a native target lacking an optional call (here, not in
    the test module that checks it, so that naming it as a target does not import that test
    module a second time under another name)."""

    touch = None
