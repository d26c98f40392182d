"""A stand-in for vLLM's kv_offload interface, so the vLLM adapter is tested without vLLM.

Written from SPEC section 10's description of the interface, not from vLLM's code. Its types
have vLLM's shape: a ``ReqContext`` dataclass with ``req_id``, ``kv_transfer_params`` and a
scratch store; ``make_offload_key(block_hash, group_idx)``, here returning a tuple rather than
bytes so that the adapter's mapping back to our keys is exercised; a ``LookupResult`` enum;
``PrepareStoreOutput`` with a ``store_spec`` whose ``block_ids`` is a numpy array; events with
``removed`` and ``metadata_only``.

``FakeManager`` is impl's manager dressed in those types: vLLM's constructor (``num_blocks``),
``take_events()`` as a generator that drains nothing until iterated, ``get_stats()`` as an
object whose ``reduce()`` gives metric name -> value (the histogram summarised, its samples
kept in ``metric_sections()``), and the tracker as the ``counts``
attribute (an ``OrderedDict``, or ``None`` below threshold 2). ``FakeEveryOfferCounts`` does the
same for a known-bad manager, ``FakeManagerWithoutTouch`` lacks ``touch`` and its events carry
the fields 0.34.0 added. ``NotAManager`` builds but has none of the interface.

The module defines ``ReqContext`` and ``make_offload_key``, so ``vllm=tests.fake_vllm:...``
targets take their types from here (``properties.vllm_adapter.resolve_vllm``).
"""
from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from kvgate.impl.base import make_key
from kvgate.impl.manager import OffloadingManager
from kvgate.properties.mutants import EveryOfferCounts


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
    removal_expected: bool = False  # fields a newer release added, which the adapter ignores
    req_context: Any = None


class Stats:
    """Metric name -> {label values: value}, a list of samples for the histogram;
    ``reduce()`` summarises the histogram to a count and a sum, so samples are only in
    ``metric_sections()``."""

    def __init__(self, values: dict[str, Any]):
        self._types = {name: "histogram" if isinstance(v, list) else "gauge"
                       for name, v in values.items()}
        self._values = {name: {(): v} for name, v in values.items()
                        if not (isinstance(v, list) and not v)}

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


class FakeManagerWithoutTouch:
    """impl's manager behind vLLM-shaped types, without ``touch`` (as vLLM 0.34.0 has it)."""

    manager_cls = OffloadingManager

    def __init__(self, num_blocks: int, cache_policy: str = "lru",
                 enable_events: bool = False, store_threshold: int = 1,
                 max_tracker_size: int = 64_000):
        self._m = self.manager_cls(num_blocks, cache_policy=cache_policy,
                                   enable_events=enable_events,
                                   store_threshold=store_threshold,
                                   max_tracker_size=max_tracker_size)

    @property
    def counts(self) -> OrderedDict | None:
        tracker = self._m.tracker
        if tracker is None:
            return None
        return OrderedDict((_theirs(k), c) for k, c in tracker.counts.items())

    def on_new_request(self, req_context: ReqContext) -> None:
        self._m.on_new_request(req_context)

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._m.on_request_finished(req_context)

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult[self._m.lookup(_ours(key), req_context).name]

    def prepare_load(self, keys, req_context: ReqContext) -> CPULoadStoreSpec:
        return CPULoadStoreSpec(self._m.prepare_load([_ours(k) for k in keys], req_context))

    def complete_load(self, keys, req_context: ReqContext) -> None:
        self._m.complete_load([_ours(k) for k in keys], req_context)

    def prepare_store(self, keys, req_context: ReqContext) -> PrepareStoreOutput | None:
        out = self._m.prepare_store([_ours(k) for k in keys], req_context)
        if out is None:
            return None
        return PrepareStoreOutput([_theirs(k) for k in out.keys_to_store],
                                  CPULoadStoreSpec(out.store_spec),
                                  [_theirs(k) for k in out.evicted_keys])

    def complete_store(self, keys, req_context: ReqContext, success: bool = True) -> None:
        self._m.complete_store([_ours(k) for k in keys], req_context, success=success)

    def reset_cache(self) -> None:
        self._m.reset_cache()

    def take_events(self):
        for event in self._m.take_events():  # runs only once the generator is iterated
            yield OffloadingEvent([_theirs(k) for k in event.keys], event.removed,
                                  event.metadata_only, removal_expected=not event.removed)

    def get_stats(self) -> Stats:
        return Stats(self._m.get_stats().as_dict())


class FakeManager(FakeManagerWithoutTouch):
    """impl's manager behind vLLM-shaped types (the interface an upstream manager has)."""

    def touch(self, keys, req_context: ReqContext) -> None:
        self._m.touch([_ours(k) for k in keys], req_context)


class FakeEveryOfferCounts(FakeManager):
    """The known-bad ``every_offer_counts`` behind the same vLLM-shaped types."""

    manager_cls = EveryOfferCounts


class NotAManager:
    """Builds with any arguments, but has none of a manager's methods."""

    def __init__(self, *args, **kwargs):
        pass
