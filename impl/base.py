"""Interface types shared by the manager, the worker, the scheduler driver and the harness.

Spec §1 and §2: keys are ``bytes`` (a block hash followed by the group index as four
big-endian unsigned bytes), requests are ``ReqContext`` objects with a per-request scratch
store, and the manager answers with ``LookupResult``, ``PrepareStoreOutput`` and
``OffloadingEvent`` values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

GROUP_BYTES = 4
_T = TypeVar("_T")


def make_key(block_hash: bytes, group_idx: int = 0) -> bytes:
    """The offload key of one block hash in one KV-cache group."""
    if not isinstance(block_hash, (bytes, bytearray)):
        raise TypeError(f"block_hash must be bytes, got {type(block_hash).__name__}")
    if not isinstance(group_idx, int) or not 0 <= group_idx < 2**32:
        raise ValueError(f"group_idx must be an int in [0, 2**32), got {group_idx!r}")
    return bytes(block_hash) + group_idx.to_bytes(GROUP_BYTES, "big")


def key_group(key: bytes) -> int:
    """The KV-cache group index stored in the last four bytes of ``key``."""
    if not isinstance(key, bytes) or len(key) < GROUP_BYTES:
        raise ValueError(f"not an offload key: {key!r}")
    return int.from_bytes(key[-GROUP_BYTES:], "big")


class LookupResult(str, enum.Enum):  # noqa: UP042 - str(member) keeps the "LookupResult.HIT" form reports print
    """A lookup's answer; each member equals its name (``LookupResult.HIT == "HIT"``), the plain
    value the reference model answers with."""

    MISS = "MISS"
    HIT = "HIT"
    HIT_PENDING = "HIT_PENDING"

    def __repr__(self) -> str:
        return f"LookupResult.{self.name}"

    __str__ = str.__str__


class ReqContext:
    """One request's context: kept by the scheduler across preemption, dropped at finish.

    ``get_state(cls)`` / ``set_state(value)`` give every component one scratch slot per type,
    so a manager keeps its per-request bookkeeping with the request itself;
    ``set_offload_key_position`` / ``get_offload_key_position`` carry each key's position in
    the request.
    """

    __slots__ = ("req_id", "kv_transfer_params", "_state", "_positions", "__weakref__")

    def __init__(self, req_id: str, kv_transfer_params: Any = None):
        self.req_id = req_id
        self.kv_transfer_params = kv_transfer_params
        self._state: dict[type, Any] = {}
        self._positions: dict[bytes, int] = {}

    def get_state(self, cls: type[_T]) -> _T | None:
        return self._state.get(cls)

    def set_state(self, value: Any) -> None:
        self._state[type(value)] = value

    def set_offload_key_position(self, key: bytes, end_token: int) -> None:
        """Where ``key`` ends in this request (its end token): the scheduler records it so that
        a manager can order the request's keys head to tail (spec R3)."""
        self._positions[key] = end_token

    def get_offload_key_position(self, key: bytes) -> int | None:
        return self._positions.get(key)

    def __repr__(self) -> str:
        return f"ReqContext({self.req_id!r})"


class PrepareStoreOutput(NamedTuple):
    """What ``prepare_store`` admits: keys in offer order, one chunk id each, and evictions."""

    keys_to_store: list[bytes]
    store_spec: list[int]
    evicted_keys: list[bytes]


class OffloadingEvent(NamedTuple):
    """Keys stored (``removed=False``) or removed from the CPU tier; a tuple ``(keys, removed,
    metadata_only)``, equal to the model's plain event."""

    keys: tuple[bytes, ...]
    removed: bool
    metadata_only: bool = False


class TransferResult(NamedTuple):
    """One finished copy job, as a worker's ``get_finished`` reports it (spec §6)."""

    job_id: int
    success: bool
    bytes: int = 0
    seconds: float = 0.0


# What ``on_new_request`` and ``get_load_source`` answer (spec section 9): the request's chunks
# are offloaded as it computes them, and a hit is served from the CPU tier.
CHUNK_LEVEL = "chunk_level"
HOST = "host"

# Upstream metric names (spec §5).
STORES_SKIPPED = "vllm:kv_offload_stores_skipped"
ALLOCATION_SIZE = "vllm:kv_offload_cpu_allocation_size"
CACHE_USAGE = "vllm:kv_offload_cpu_cache_usage_perc"
WRITE_USAGE = "vllm:kv_offload_cpu_cache_write_usage_perc"
READ_USAGE = "vllm:kv_offload_cpu_cache_read_usage_perc"


@dataclass
class Stats:
    """What ``get_stats()`` returns: counters and samples since the last call, gauges now.

    ``as_dict()`` gives a flat name -> value mapping (a list for the histogram).
    """

    stores_skipped: int | None
    allocation_sizes: list[int] = field(default_factory=list)
    cache_usage: float = 0.0
    write_usage: float = 0.0
    read_usage: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            ALLOCATION_SIZE: list(self.allocation_sizes),
            CACHE_USAGE: self.cache_usage,
            WRITE_USAGE: self.write_usage,
            READ_USAGE: self.read_usage,
        }
        if self.stores_skipped is not None:
            out[STORES_SKIPPED] = self.stores_skipped
        return out


class OffloadProtocolError(ValueError):
    """A call that breaks the manager's protocol (spec §8); the manager is unchanged."""
