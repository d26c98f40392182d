"""Where the connector keeps its manager: ``Front`` sends each call through the lockstep oracle
and hands vLLM exactly what the real manager returned; ``build_oracle`` and ``manager_factory``
say what stands behind the connector for a target."""

from __future__ import annotations

import contextlib
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvgate.impl.base import STORES_SKIPPED

from ...adapters import Config, factory_takes, model_for
from ...oracle import LockstepManager
from .checks import Checks
from .configs import Setup

# ---------------------------------------------------------------------------- the front
_NOT_ASKED = object()  # the adapter's raw answer before a call reaches the manager


class LacksCall(AttributeError, AssertionError):
    """An optional call the target lacks, asked for by vLLM's connector: an ``AttributeError``
    to ``hasattr``, and to the gate a counterexample of the target (an ``AssertionError``),
    never kvgate's own error."""


class Front:
    """Stands where the connector scheduler keeps its manager. Each call goes through the
    oracle; vLLM gets back what the real manager returned. ``calls`` counts calls by name;
    ``unchecked`` names the calls that went to the real manager without the oracle."""

    # Calls the oracle may not have yet: through it where it has them, else to the manager.
    OPTIONAL = (
        "get_load_source",
        "config_info",
        "has_pending_work",
        "on_schedule_end",
        "on_reset_flushed",
        "shutdown",
        "touch",
    )

    def __init__(
        self,
        oracle: LockstepManager | _Unchecked,
        adapter: Any,
        real: Any,
        checks: Checks,
    ):
        self.oracle = oracle
        self.adapter = adapter
        self.real = real
        self.checks = checks
        self.calls: Counter = Counter()
        self.unchecked: set[str] = set()
        self.exact: Any = None  # exact.ExactChecks, where the engine set one
        self.reports_stats = True  # False: get_stats answers None (a manager with metrics off)
        # True: lookups answer as a tier that promotes chunks from a slower one (tiered_answer)
        self.tiered = False
        self.step = 0  # the engine's step, set by the engine (tiered answers last one step)
        self._first: dict[tuple[bytes, str], int] = {}  # (key, real answer) -> first step

    @property
    def lock(self):
        """The manager's lock, watched: ``held`` counts the regions inside it."""
        return _WatchedLock(self, getattr(self.real, "lock", None) or contextlib.nullcontext())

    held = 0  # regions of the connector inside the manager's lock, now
    in_schedule = False  # inside the scheduler's schedule()
    last_call = "its first call"  # the latest manager call, with its request
    let_go: str | None = None  # the call after which a schedule() let the lock go

    @staticmethod
    def _call_name(name: str, args: tuple) -> str:
        ctx = next((a for a in args if hasattr(a, "req_id")), None)
        return f"{name} ({ctx.req_id})" if ctx is not None else name

    LOCKED_CALLS = frozenset(
        {
            "lookup",
            "prepare_load",
            "complete_load",
            "prepare_store",
            "complete_store",
            "on_new_request",
            "on_request_finished",
            "reset_cache",
        }
    )

    def _through(self, name: str, *args, **kwargs) -> Any:
        """The call through the oracle; what the real manager answered (``None`` where the
        oracle did not ask it: a call the target lacks)."""
        self.calls[name] += 1
        call = self._call_name(name, args)
        if self.exact is not None and name in self.LOCKED_CALLS:
            self.exact.locked_call(name, self.held, self.let_go, call)
            self.let_go = None
        self.last_call = call
        self.adapter.raw = _NOT_ASKED
        getattr(self.oracle, name)(*args, **kwargs)
        raw, self.adapter.raw = self.adapter.raw, None
        return None if raw is _NOT_ASKED else raw

    def _named(self, call: str, req_context: Any) -> None:
        if self.exact is not None:
            self.exact.named(call, req_context)

    def lookup(self, key, req_context=None):
        self._named("lookup", req_context)
        out = self._through("lookup", key, req_context)
        if self.tiered:
            out = self.tiered_answer(bytes(key), out)
        if self.exact is not None:
            self.exact.looked_up(out, bytes(key))
        return out

    def tiered_answer(self, key: bytes, out: Any) -> Any:
        """What a tiered manager answers where the CPU manager answered ``out``: in the step a
        chunk is first looked up with that answer, the tier is still finding out where the
        chunk is (``RETRY``), or still promoting a chunk it holds (``HIT_PENDING``), by the
        chunk's hash; from the next step on it answers as the CPU manager does."""
        name = getattr(out, "name", None)
        if name not in ("HIT", "MISS"):
            return out
        if self._first.setdefault((key, name), self.step) != self.step:
            return out
        pick = zlib.crc32(key) & 3
        if name == "HIT":
            return out if pick == 0 else type(out).HIT_PENDING if pick == 3 else type(out).RETRY
        return type(out).RETRY if pick >= 2 else out

    def prepare_load(self, keys, req_context=None):
        self._named("prepare_load", req_context)
        keys = list(keys)
        out = self._through("prepare_load", keys, req_context)
        self.checks.loaded(keys, out)
        if self.exact is not None:
            self.exact.loaded([bytes(k) for k in keys], req_context)
        return out

    def complete_load(self, keys, req_context=None):
        return self._through("complete_load", list(keys), req_context)

    def prepare_store(self, keys, req_context):
        self._named("prepare_store", req_context)
        keys = list(keys)
        self.checks.offered(keys, req_context)
        out = self._through("prepare_store", keys, req_context)
        self.checks.prepared(keys, req_context, out)
        if self.exact is not None:
            self.exact.offered([bytes(k) for k in keys], req_context, out)
        return out

    def complete_store(self, keys, req_context=None, success: bool = True):
        keys = list(keys)
        self._through("complete_store", keys, req_context, success=success)
        self.checks.completed(keys)
        return None

    def on_new_request(self, req_context):
        if self.exact is not None:
            self.exact.new_request(req_context)
        name = getattr(self.oracle, "name", None)
        if callable(name):  # a divergence names the request by its id
            name(req_context, str(getattr(req_context, "req_id", "?")))
        return self._through("on_new_request", req_context)

    def on_request_finished(self, req_context):
        self._named("on_request_finished", req_context)
        if self.exact is not None:
            self.exact.finished(req_context)
        return self._through("on_request_finished", req_context)

    def reset_cache(self):
        out = self._through("reset_cache")
        self.checks.reset()
        return out

    def take_events(self):
        return iter(list(self._through("take_events") or ()))

    def get_stats(self):
        self.calls["get_stats"] += 1
        self.adapter.raw = _NOT_ASKED
        plain = self.oracle.get_stats() or {}
        self.checks.stats["skips"] += int(plain.get(STORES_SKIPPED, 0) or 0)
        raw, self.adapter.raw = self.adapter.raw, None
        return None if raw is _NOT_ASKED or not self.reports_stats else raw

    def __getattr__(self, name: str) -> Any:
        if name not in self.OPTIONAL:
            raise AttributeError(name)
        real = getattr(self.real, name, None)
        if real is None:
            # hasattr() and getattr(..., default) still read it as absent; a connector that
            # calls it anyway has found the target's gap, not kvgate's
            raise LacksCall(f"vLLM's connector asked the target for {name}(), which it lacks")
        checked = getattr(type(self.oracle), name, None)

        def call(*args, **kwargs):
            if checked is not None:
                return self._through(name, *args, **kwargs)
            self.calls[name] += 1
            self.unchecked.add(name)
            return real(*args, **kwargs)

        return call


class _WatchedLock:
    """The manager's lock as the connector enters it, counting the regions held."""

    def __init__(self, front: Front, lock: Any):
        self.front, self.lock = front, lock

    def __enter__(self):
        out = self.lock.__enter__()
        self.front.held += 1
        return out

    def __exit__(self, *exc):
        self.front.held -= 1
        if not self.front.held and self.front.in_schedule:
            self.front.let_go = self.front.last_call
        return self.lock.__exit__(*exc)


class _Unchecked:
    """In place of the oracle (``lockstep=False``, for the tests of the request-level checks
    alone): every call goes to the adapter unchecked."""

    def __init__(self, adapter: Any):
        self.adapter = adapter

    def set_step(self, step: int) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.adapter, name)


def spec_config_info(setup: Setup, chunk_bytes: int) -> list[dict[str, Any]]:
    """What a manager built by the connector's ``CPUOffloadingSpec`` publishes as its
    configuration (``config_info``): the tier's chunks, blocks per chunk, size in bytes (the
    spec's aligned chunk size) and the tokens it holds for requests of ``max_model_len``
    tokens (the chunks one such request keeps, over every KV-cache group of the layout: all of
    a full-attention group's, a sliding-window group's window)."""
    chunk_tokens = setup.block_size * setup.blocks_per_chunk
    per_request = setup.layout.chunks_per_request(setup.max_model_len, chunk_tokens)
    return [
        {
            "cpu_num_chunks": setup.num_chunks,
            "cpu_blocks_per_chunk": setup.blocks_per_chunk,
            "cpu_kv_cache_size_bytes": setup.num_chunks * chunk_bytes,
            "cpu_kv_cache_size_tokens": setup.num_chunks * setup.max_model_len // per_request,
        }
    ]


def build_oracle(
    adapter: Any,
    setup: Setup,
    target: Any,
    *,
    key_name=None,
    log=None,
    config_info: list | None = None,
) -> LockstepManager:
    """The lockstep oracle over ``adapter``, judging it as ``target`` says (exact for a vLLM
    release, foreign for ``foreign=vllm...``: spec §9), the model built with the recency the
    target was found to have (spec §4). ``config_info``: what the manager was told to publish
    (a manager the connector's spec built), else the model's own answer."""
    model = model_for(
        Config(
            num_chunks=setup.num_chunks,
            store_threshold=setup.store_threshold,
            max_tracker_size=setup.max_tracker_size,
            cache_policy=setup.policy,
            enable_events=setup.kv_events,
            recency=target.recencies[0],
        )
    )
    if config_info is not None:  # the answer this model gives, on this instance only
        model.config_info = lambda: [dict(m) for m in config_info]
    kwargs: dict[str, Any] = {"foreign": target.foreign, "log": log}
    if key_name is not None:
        kwargs["key_name"] = key_name
    return LockstepManager(adapter, model, **kwargs)


def manager_factory(target: Any) -> Callable[[Setup, Any], Any] | None:
    """What stands behind the connector for ``target``: ``None`` for ``vllm`` (the manager the
    connector's own spec built), else the ``vllm=MODULE:ATTR`` class built with the setup's
    sizes (``target.factory``: num_chunks, cache_policy, store_threshold, max_tracker_size,
    enable_events as the connector's spec would pass it)."""
    if target.spec in ("vllm", "foreign=vllm"):
        return None

    def build(setup: Setup, built: Any, make=target.factory) -> Any:
        kwargs = {}
        if factory_takes(make, "info"):  # what the spec told its own manager to publish
            kwargs["info"] = PublishedInfo(built.config_info()[0])
        return make(
            setup.num_chunks,
            cache_policy=setup.policy,
            store_threshold=setup.store_threshold,
            max_tracker_size=setup.max_tracker_size,
            enable_events=setup.kv_events,
            **kwargs,
        )

    return build


@dataclass(frozen=True)
class PublishedInfo:
    """The facts a manager publishes about its tier (``config_info``), handed to a
    ``vllm=MODULE:ATTR`` manager as the connector's spec hands its own manager a
    ``CPUOffloadingInfo``: the manager asks it only for ``as_config_info()``."""

    facts: Any

    def as_config_info(self) -> dict:
        return dict(self.facts)
