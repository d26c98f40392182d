"""Reaching a manager that follows vLLM's interface (spec section 10), for the ``vllm`` and
``vllm=MODULE:ATTR`` targets.

``vllm`` is the installed vLLM's ``CPUOffloadingManager``; ``vllm=MODULE:ATTR`` is any class
with vLLM's interface (a patched manager under review, or a stand-in in tests). A vLLM release
is **checked exactly** (spec section 9): its policies are documented, so the model predicts its
evictions, chunk ids, policy order, events and every metric, and the answers of every interface
call are compared. ``foreign=vllm...`` keeps the legality-and-adopt rule for a manager whose
policy the spec does not describe.

By capability, never by version (spec section 10):

- recency (spec section 4): a policy with the request-scoped hooks (``on_request_access``,
  ``on_request_finished``) is request-scoped (0.33.0 and 0.34.0); one with only ``touch`` is
  touch-based; ``touch`` on the manager is optional (0.34.0 removed it) and never drawn when
  missing;
- events: ``removal_expected`` and ``req_context`` are compared where the event type has them;
- what the oracle inspects beyond the answers (the tracker, the policy's order, the pool and
  each chunk's ref count) is read from the attributes named in ``INTERNALS``, the only place
  where the adapter reaches past vLLM's public interface; a manager without them is still
  checked on every answer, and the report names what it could not inspect.

``VllmAdapter`` turns vLLM's answers into the plain values of ``properties.adapters``: our keys
are ``bytes`` (block hash + 4-byte big-endian group), vLLM's come from
``make_offload_key(block_hash, group_idx)``, and the adapter maps them back, whatever type
vLLM's keys are. Types come in a ``VllmTypes`` (from ``vllm.v1.kv_offload.base``, or from the
module that defines the target class when it defines its own ``ReqContext`` and
``make_offload_key``), so the adapter can be tested without vLLM. Stats: ``reduce()`` may
summarise the histogram, so its samples are read from the unreduced ``metric_sections()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from kvgate.impl.base import (
    ALLOCATION_SIZE,
    CACHE_USAGE,
    GROUP_BYTES,
    READ_USAGE,
    STORES_SKIPPED,
    WRITE_USAGE,
    LookupResult,
    key_group,
)

from ... import answers
from ...adapters import (
    POLICIES,
    Adapter,
    Event,
    Residency,
    StoreAnswer,
    Target,
    TargetError,
    check_interface,
    import_attr,
)

VLLM_MANAGER = "vllm.v1.kv_offload.cpu.manager"
VLLM_MANAGER_CLASS = "CPUOffloadingManager"
VLLM_TYPES = "vllm.v1.kv_offload.base"
# Where a release keeps ReqContext and make_offload_key: base.py, or abstract.py before the
# rename (upstream #40538); the interface is read from the calls' signatures, not from which.
TYPE_HOMES = (VLLM_TYPES, "vllm.v1.kv_offload.abstract")
# What spec section 10 lists next to the CPU build of torch; the wheel itself goes in with
# --no-deps so that its CUDA dependency set stays out.
VLLM_CPU_PACKAGES = (
    "packaging psutil pyzmq urllib3 regex numpy transformers cbor2 aiohttp "
    "requests openai-harmony openai pillow pybase64 cachetools msgspec "
    "cloudpickle uvloop py-cpuinfo prometheus_client xgrammar fastapi "
    "partial_json_parser llguidance"
)
INSTALL_HINT = (
    "install it next to the CPU build of torch: pip install --no-deps "
    "vllm==<version> && pip install " + VLLM_CPU_PACKAGES
)

# The attributes past vLLM's public interface that the adapter reads, all of them, for what the
# oracle inspects where vLLM has no public answer. Everything else goes through public calls.
INTERNALS = {
    "policy": "_policy",  # the manager's CachePolicy (its get(key) gives ref_cnt, chunk_id)
    "lru_ranks": "_ranks",  # request-scoped LRU: key -> rank
    "arc_target": "target_t1_size",  # ARC's p; its lists are t1, t2, b1, b2
    "free_list": "_free_list",  # freed chunk ids
    "allocated": "_num_allocated_chunks",  # ids handed out so far (never-used ones are above)
    "size": "_num_chunks",
    # a manager wrapped by a threshold filter (vLLM 0.21.0's FilterReusedOffloadingManager):
    # the policy and the pool are the wrapped manager's
    "backing": "_backing",
}
# The same internals under the names releases before 0.30.0 gave them ("block" for "chunk").
OLDER_NAMES = {
    "_num_allocated_chunks": "_num_allocated_blocks",
    "_num_chunks": "_num_blocks",
    "chunk_id": "block_id",
}
# Where a release keeps the threshold outside the manager: a wrapper class, found by capability
# next to the types module, and built the way the release's own spec builds it (T >= 2 only).
THRESHOLD_WRAPPER = ("vllm.v1.kv_offload.reuse_manager", "FilterReusedOffloadingManager")
REQUEST_HOOKS = ("on_request_access", "on_request_finished")
# What each answer must be, in the words of vLLM's interface (properties/answers.py).
W = answers.VLLM
LOOKUP_NAMES = ("MISS", "HIT", "HIT_PENDING", "RETRY")
# The calls that name a request context after their keys, in the interface kvgate drives; each
# is asked its own signature (``calls_without_context``), never the module layout.
CONTEXT_CALLS = (
    "lookup",
    "get_load_source",
    "prepare_load",
    "complete_load",
    "touch",
    "prepare_store",
    "complete_store",
)


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("vllm")
    except (ImportError, PackageNotFoundError):
        return None


@dataclass(frozen=True)
class VllmTypes:
    """The two vLLM types an adapter must build: request contexts and offload keys."""

    ReqContext: Callable[..., Any]
    make_offload_key: Callable[[bytes, int], Any]
    source: str = ""

    @classmethod
    def from_module(cls, module) -> VllmTypes:
        missing = [n for n in ("ReqContext", "make_offload_key") if not hasattr(module, n)]
        if missing:
            raise TargetError(f"{module.__name__} does not define {', '.join(missing)}")
        return cls(module.ReqContext, module.make_offload_key, module.__name__)


def types_module() -> Any:
    """The installed vLLM's module of request types (the first of ``TYPE_HOMES`` that defines
    ``ReqContext`` and ``make_offload_key``), or None."""
    for name in TYPE_HOMES:
        try:
            module = importlib.import_module(name)
        except Exception:  # absent, or a dependency that fails while importing
            continue
        if hasattr(module, "ReqContext") and hasattr(module, "make_offload_key"):
            return module
    return None


def vllm_types() -> VllmTypes:
    """The installed vLLM's types; ``TargetError`` (one line: how to install) without it."""
    module = types_module()
    if module is not None:
        return VllmTypes.from_module(module)
    try:
        importlib.import_module(VLLM_TYPES)
    except Exception as exc:  # ImportError, or a dependency that fails while importing
        if installed_vllm_version() is None:
            raise TargetError(
                f"vLLM is not importable ({_one_line(exc)}); {INSTALL_HINT}"
            ) from None
    raise TargetError(
        f"vLLM {installed_vllm_version()}: none of {', '.join(TYPE_HOMES)} defines ReqContext and "
        "make_offload_key, so its offloading calls name no request: nothing is checked"
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _plain(value: Any) -> Any:
    """An enum member as its value (``CacheHitSource.HOST`` -> ``"host"``), else as it is."""
    return getattr(value, "value", value)


def _ids(spec: Any) -> list[int]:
    """Chunk ids of a load/store spec (``answers.spec_block_ids`` checked it first): its
    ``block_ids``, a numpy array in vLLM."""
    return [int(i) for i in spec.block_ids]


_CONTEXT_PARAMS = ("req_context", "request_context", "req_ctx", "ctx", "context")
_BLIND: dict[type, frozenset[str]] = {}


def takes_context(fn: Any) -> bool:
    """Whether a call names a request context after its keys, read from its own signature: a
    parameter named for one (``req_context``), or ``*args``/``**kwargs`` that pass anything on
    (a wrapper); a signature that cannot be read is taken to (the interface kvgate drives)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return any(p.kind in variadic or p.name in _CONTEXT_PARAMS for p in params)


def calls_without_context(manager_or_class: Any) -> frozenset[str]:
    """The calls of ``CONTEXT_CALLS`` the manager has whose signature names no request
    context (an upstream version between releases: ``complete_store(keys, success)`` beside
    the new module layout), found once per class."""
    cls = manager_or_class if isinstance(manager_or_class, type) else type(manager_or_class)
    found = _BLIND.get(cls)
    if found is None:
        found = frozenset(
            name
            for name in CONTEXT_CALLS
            if callable(getattr(cls, name, None)) and not takes_context(getattr(cls, name))
        )
        _BLIND[cls] = found
    return found


class VllmAdapter(Adapter):
    """A manager with vLLM's interface, answering in kvgate's plain values."""

    INTERFACE = "vLLM's manager interface"

    def __init__(
        self,
        manager,
        types: VllmTypes | None = None,
        feed: str = "offer",
        offload_policy: Any = None,
        lookup_bool: bool = False,
        metadata_events: bool = True,
        blind: frozenset[str] | None = None,
        new_request_none: bool = False,
    ):
        super().__init__(manager)
        self.types = types or vllm_types()
        self._theirs: dict[bytes, Any] = {}  # our key -> vLLM's key
        self._ours: dict[Any, bytes] = {}  # vLLM's key -> our key
        self._ctx_kwargs = self._context_kwargs(self.types.ReqContext)
        # where the tracker counts (spec §3.2): with "lookup", a lookup kvgate makes for itself
        # (no context) must not reach the manager, whose every lookup counts
        self.feed = feed
        # the offloading policy this release answers on_new_request with (its documented
        # choice, learnt from a fresh manager; the oracle holds every answer to it)
        self.offload_policy = offload_policy
        # lookup answers a bool or None (releases before 0.25.0), read from its signature
        self.lookup_bool = lookup_bool
        # whether its event type can say "metadata only" (a failed store's removal)
        self.metadata_events = metadata_events
        # the calls whose own signature names no request context: called without one
        self.blind = calls_without_context(manager) if blind is None else blind
        # on_new_request declared to answer nothing (``-> None``): no policy is asked of it
        self.new_request_none = new_request_none
        # the manager that holds the policy and the pool (a threshold wrapper's backing one)
        self.inner = getattr(manager, INTERNALS["backing"], None) or manager

    @classmethod
    def with_types(cls, types: VllmTypes, **learned: Any) -> Callable[[Any], VllmAdapter]:
        """An adapter constructor bound to ``types`` and what was learnt of the release (what
        ``Target.adapter`` is called with)."""
        return partial(cls, types=types, **learned)

    # --- contexts and keys ---

    @staticmethod
    def _context_kwargs(ctx_cls) -> dict[str, Any]:
        try:
            params = inspect.signature(ctx_cls).parameters
        except (TypeError, ValueError):
            return {}
        kwargs: dict[str, Any] = {}
        if "kv_transfer_params" in params:
            kwargs["kv_transfer_params"] = None
        if "req_id" in params:
            kwargs["req_id"] = None  # filled in by new_context
        return kwargs

    def new_context(self, req_id: str):
        """A request context; its ``req_id`` where the release's context has one (0.21.0's has
        none)."""
        kwargs = dict(self._ctx_kwargs)
        if "req_id" in kwargs:
            kwargs["req_id"] = req_id
        if kwargs or not self._ctx_kwargs:
            try:
                return self.types.ReqContext(**kwargs)
            except TypeError:
                pass
        return self.types.ReqContext(req_id)

    @staticmethod
    def holds_positions(ctx_type: Any) -> bool:
        """Whether the release's request context can hold key positions (0.30.0's cannot)."""
        return callable(getattr(ctx_type, "set_offload_key_position", None))

    def set_position(self, ctx, key: bytes, position: int) -> None:
        """Where the context cannot hold positions (spec §1) none is set: the request is one
        whose keys have none, on both sides (``position`` answers ``None``)."""
        if self.holds_positions(ctx):
            ctx.set_offload_key_position(self._key(key), position)

    def position(self, ctx, key: bytes) -> int | None:
        get = getattr(ctx, "get_offload_key_position", None)
        return None if get is None else get(self._key(key))

    def _key(self, key: bytes) -> Any:
        theirs = self._theirs.get(key) if isinstance(key, bytes) else None
        if theirs is None:
            if not isinstance(key, bytes) or len(key) < GROUP_BYTES:
                return key  # not one of ours: let the manager answer it
            theirs = self.types.make_offload_key(key[:-GROUP_BYTES], key_group(key))
            self._theirs[key] = theirs
            try:
                self._ours[theirs] = key
            except TypeError:  # an unhashable key type: answers keep vLLM's keys
                pass
        return theirs

    def _keys(self, keys: Iterable[bytes]) -> list[Any]:
        return [self._key(k) for k in keys]

    def _back(self, key: Any) -> Any:
        try:
            return self._ours.get(key, key)
        except TypeError:
            return key

    def _backs(self, keys: Iterable[Any]) -> list[Any]:
        return [self._back(k) for k in keys]

    # --- the manager protocol ---

    def on_new_request(self, ctx) -> Any:
        answer = self._call("on_new_request", ctx)
        if answer is None and self.new_request_none:  # declared "-> None": no policy to give
            return None
        policy = getattr(answer, "policy", None)
        if policy is None:
            raise answers.bad("on_new_request", answers.shown(answer), W["new_request"])
        return answers.named("on_new_request", policy, W["new_request"])

    def on_request_finished(self, ctx) -> None:
        self._call("on_request_finished", ctx)

    def lookup(self, key: bytes, ctx=None) -> LookupResult:
        """The answer as a ``LookupResult``. Releases before 0.25.0 answer a bool or ``None``
        (``True`` ready, ``False`` absent, ``None`` "write in flight, retry"), later ones an
        enum; either is read by what it is, and anything else is a ``BadAnswer``. Without a
        context (kvgate reading residency) on a target that counts every lookup, the policy is
        read instead, so that kvgate's own look adds no count (spec §3.2)."""
        if ctx is None and self.feed == "lookup":
            return self.peek(key)
        result = self._with_context("lookup", self._key(key), ctx)
        if self.lookup_bool:
            if result is True or result is False or result is None:
                return LookupResult(
                    "HIT" if result else "MISS" if result is False else "HIT_PENDING"
                )
            raise answers.bad("lookup", answers.shown(result), W["lookup_bool"])
        name = answers.named("lookup", result, W["lookup"], LOOKUP_NAMES)
        # RETRY is the interface's, never the model's: returned as it is, it differs
        return LookupResult(name) if name in LookupResult.__members__ else name  # type: ignore[return-value]

    def peek(self, key: bytes) -> LookupResult:
        """Residency read off the policy (no call the manager counts)."""
        chunk = self._policy.get(self._key(key))
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    def get_load_source(self, key: bytes, ctx=None) -> str:
        answer = self._with_context("get_load_source", self._key(key), ctx)
        return answers.named("get_load_source", answer, W["load_source"])

    def config_info(self) -> list:
        return answers.config_info("config_info", self._call("config_info"), W["config_info"])

    def has_pending_work(self) -> bool:
        answer = self._call("has_pending_work")
        return answers.boolean("has_pending_work", answer, W["has_pending_work"])

    def prepare_load(self, keys, ctx=None) -> list[int]:
        spec = self._with_context("prepare_load", self._keys(keys), ctx)
        answers.spec_block_ids("prepare_load", spec, W["spec"])
        return _ids(spec)

    def complete_load(self, keys, ctx=None) -> None:
        self._with_context("complete_load", self._keys(keys), ctx)

    def touch(self, keys, ctx=None) -> None:
        self._with_context("touch", self._keys(keys), ctx)

    def prepare_store(self, keys, ctx):
        out = self._with_context("prepare_store", self._keys(keys), ctx)
        checked = answers.store_output("prepare_store", out, W, vllm=True)
        if checked is None:
            return None
        stored, spec, evicted = checked
        return StoreAnswer(self._backs(stored), _ids(spec), self._backs(evicted))

    def complete_store(self, keys, ctx=None, success: bool = True) -> None:
        self._with_context("complete_store", self._keys(keys), ctx, success=success)

    def _with_context(self, name: str, first: Any, ctx: Any, **kwargs: Any) -> Any:
        """``name(first, ctx, ...)``, or ``name(first, ...)`` where the call's own signature
        names no request context (an upstream version between releases may keep the old form
        of some calls beside the new module layout)."""
        if name in self.blind:
            return self._call(name, first, **kwargs)
        return self._call(name, first, ctx, **kwargs)

    def reset_cache(self) -> None:
        self._call("reset_cache")

    def take_events(self) -> list[Event]:
        """The drained events; where the event type names the storing request
        (``req_context``, 0.34.0's store-event contract: a store event names its request and
        expects its removal), that request and ``removal_expected`` too. 0.33.0's type has an
        inert ``removal_expected`` its CPU manager never sets and no ``req_context``: spec §10
        counts both as 0.34.0's, so neither is read there."""
        # vLLM's take_events() is a generator: nothing is drained until it is iterated.
        events = answers.events("take_events", self._call("take_events"), W["events"])
        self.raw = events
        return [
            Event(
                tuple(self._backs(e.keys)),
                bool(e.removed),
                bool(getattr(e, "metadata_only", False)),
                *((e.removal_expected, e.req_context) if hasattr(e, "req_context") else ()),
            )
            for e in events
        ]

    def get_stats(self) -> dict[str, Any] | None:
        stats = self._call("get_stats")
        if stats is None:
            return None  # "None if disabled": the oracle judges whether it may be
        if isinstance(stats, Mapping):
            raw = stats
        elif callable(getattr(stats, "reduce", None)):
            raw = answers.metrics(
                "get_stats", stats.reduce(), W["stats"], "stats whose reduce() gave "
            )
        elif callable(getattr(stats, "as_dict", None)):
            raw = answers.metrics(
                "get_stats", stats.as_dict(), W["stats"], "stats whose as_dict() gave "
            )
        else:
            raise answers.bad("get_stats", answers.shown(stats), W["stats"])
        raw = {_metric_name(name): value for name, value in dict(raw).items()}
        out: dict[str, Any] = {}
        for name in (STORES_SKIPPED, CACHE_USAGE, WRITE_USAGE, READ_USAGE):
            value = raw.get(name)
            answers.metric_value("get_stats", name, value, W["stats"])
            if value is not None:
                out[name] = value
        # reduce() may summarise the histogram (count and sum): read its samples unreduced.
        samples = _samples(raw.get(ALLOCATION_SIZE))
        if samples is None:
            samples = _raw_histogram(stats, ALLOCATION_SIZE)
        if samples is not None:
            out[ALLOCATION_SIZE] = samples
        return out

    # --- what the oracle inspects (INTERNALS) ---

    def _internal(self, owner: Any, name: str) -> Any:
        attr = INTERNALS[name]
        value = getattr(owner, attr, None)
        if value is None and attr in OLDER_NAMES:
            value = getattr(owner, OLDER_NAMES[attr], None)
        return value

    @property
    def _policy(self) -> Any:
        return self._internal(self.inner, "policy")

    def uninspectable(self) -> list[str]:
        """What this manager does not let the adapter inspect (named in the report)."""
        policy = self._policy
        if policy is None:
            return [f"the policy ({INTERNALS['policy']})"]
        lacking = [
            INTERNALS[n]
            for n in ("free_list", "allocated", "size")
            if self._internal(self.inner, n) is None
        ]
        if (
            self._internal(policy, "lru_ranks") is None
            and self._internal(policy, "arc_target") is None
        ):
            lacking.append(
                f"the policy's order ({INTERNALS['lru_ranks']} or {INTERNALS['arc_target']})"
            )
        return lacking

    def tracker_items(self) -> list[tuple[Any, int]] | None:
        counts = getattr(self.manager, "counts", None)
        if counts is None:
            return None
        items = list(counts.items()) if callable(getattr(counts, "items", None)) else None
        if items is None or not all(answers.is_integer(c) for _, c in items):
            raise answers.bad(
                "the tracker (counts)", answers.shown(counts), "a mapping of keys to int counts"
            )
        return [(self._back(k), int(c)) for k, c in items]

    def resident(self, key: bytes) -> Residency | None:
        chunk = self._policy.get(self._key(key))
        if chunk is None:
            return None
        chunk_id = getattr(chunk, "chunk_id", None)
        if chunk_id is None:
            chunk_id = getattr(chunk, OLDER_NAMES["chunk_id"], None)
        ref = getattr(chunk, "ref_cnt", None)
        if not answers.is_integer(chunk_id) or not answers.is_integer(ref):
            raise answers.bad(
                f"the policy's entry for {answers.shown(self._key(key))}",
                answers.shown(chunk),
                "a chunk status with an int chunk_id and ref_cnt",
            )
        return Residency(int(cast(int, chunk_id)), int(cast(int, ref)))

    def inspectable(self) -> bool:
        return not self.uninspectable()

    def free_chunks(self) -> int | None:
        parts = [self._internal(self.inner, n) for n in ("free_list", "allocated", "size")]
        if None in parts:
            return None
        free_list, allocated, size = parts
        return len(free_list) + size - allocated

    def policy_state(self) -> dict | None:
        """The policy's order as the model states it; its internals are checked for their
        shape first, like any answer: a policy whose state is not what its own code reads
        (an ARC list set to ``None``) is the target's divergence, not kvgate's error."""
        policy = self._policy
        ranks = self._internal(policy, "lru_ranks")
        if ranks is not None:
            try:  # a mapping whose ranks (ints, or tuples of them) order its keys
                order = sorted(ranks.items(), key=lambda kr: (kr[1], kr[0]))
            except (AttributeError, TypeError):
                raise answers.bad(
                    f"the policy's order ({INTERNALS['lru_ranks']})",
                    answers.shown(ranks),
                    "a mapping of keys to ranks that order them",
                ) from None
            return {"lru": [self._back(k) for k, _ in order]}
        p = self._internal(policy, "arc_target")
        if p is None:
            return None
        state: dict[str, Any] = {}
        for name in ("t1", "t2", "b1", "b2"):
            keys = getattr(policy, name, None)
            if not isinstance(keys, Iterable) or isinstance(keys, (str, bytes)):
                raise answers.bad(
                    f"the policy's order (ARC's {name})",
                    answers.shown(keys),
                    "an ordered collection of keys",
                )
            state[name] = self._backs(keys)
        return {**state, "p": p}


def recency_of(manager: Any) -> str | None:
    """Which recency semantics a built manager's policy has (spec section 4), or None."""
    policy = getattr(manager, INTERNALS["policy"], None)
    if policy is not None and all(callable(getattr(policy, n, None)) for n in REQUEST_HOOKS):
        return "request"
    if callable(getattr(policy, "touch", None)) or callable(getattr(manager, "touch", None)):
        return "touch"
    return None


def _metric_name(name: Any) -> str:
    if isinstance(name, str):
        return name
    value = getattr(name, "value", None)  # an enum of metric names
    if isinstance(value, str):
        return value
    return str(getattr(name, "name", name))


def _samples(value: Any) -> list[int] | None:
    """A histogram's samples as a list of ints, or None when ``value`` is not a list of
    numbers (a reduced summary, say)."""
    if isinstance(value, (str, bytes, dict)) or value is None:
        return None
    try:
        items = list(value)
    except TypeError:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
        return None
    return [int(v) for v in items]


def _raw_histogram(stats: Any, name: str) -> list[int] | None:
    """A histogram's samples from a stats object that keeps them unreduced: vLLM's
    ``metric_sections()`` (types, then values: name -> {label values: samples}). ``[]`` when
    it exists but has no sample of ``name``; ``None`` when the stats object keeps none."""
    sections = getattr(stats, "metric_sections", None)
    if not callable(sections):
        return None
    for store in sections():
        if not isinstance(store, dict):
            continue
        for key, value in store.items():
            if _metric_name(key) != name:
                continue
            if isinstance(value, dict):  # label values -> samples
                merged: list = []
                for per_label in value.values():
                    merged += list(per_label) if isinstance(per_label, (list, tuple)) else []
                value = merged
            samples = _samples(value)
            if samples is not None:
                return samples
    return []


def vllm_factory(
    cls: Callable[..., Any], spec: str, wrapper: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """A factory ``(num_chunks, cache_policy, store_threshold, max_tracker_size,
    enable_events)`` for a class with vLLM's constructor, whichever name its size argument
    has; ``TargetError`` when it takes none of the admission rule's arguments.

    Where the class takes them, two more (``TAKES`` on the factory names which): with
    ``policy_by_path`` the policy is named the out-of-tree way, by its class name and
    ``cache_policy_module_path`` (the class a manager built with the registered name holds,
    found once per name); ``info`` is handed on as the facts the manager publishes
    (``config_info``), as the connector's spec hands its own.

    ``wrapper``: where the class takes no ``store_threshold`` but the release keeps the
    threshold in a wrapper (vLLM 0.21.0's ``FilterReusedOffloadingManager``), a manager built
    with T >= 2 is wrapped as the release's own offloading spec wraps it."""
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    size = next((n for n in ("num_chunks", "num_blocks") if n in params), None)
    if size is None and takes_any:
        size = "num_chunks"
    takes_threshold = not params or takes_any or "store_threshold" in params
    for name, why in (
        ("store_threshold", "it predates the admission rule"),
        ("enable_events", "its events cannot be switched on and checked"),
    ):
        if name == "store_threshold" and wrapper is not None:
            continue
        if params and name not in params and not takes_any:
            raise TargetError(f"target {spec!r} takes no {name}: {why}")
    by_path: dict[str, dict[str, str]] = {}

    def factory(
        num_chunks: int,
        cache_policy: str = "lru",
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        enable_events: bool = True,
        *,
        policy_by_path: bool = False,
        info: Any = None,
    ):
        kwargs: dict[str, Any] = dict(cache_policy=cache_policy, enable_events=enable_events)
        if takes_threshold:
            kwargs.update(store_threshold=store_threshold, max_tracker_size=max_tracker_size)
        elif store_threshold >= 2 and wrapper is not None:
            manager = factory(num_chunks, cache_policy, 1, max_tracker_size, enable_events)
            return wrapper(
                backing=manager,
                store_threshold=store_threshold,
                max_tracker_size=max_tracker_size,
            )
        if info is not None:
            kwargs["info"] = info
        if policy_by_path:
            if cache_policy not in by_path:
                policy = getattr(factory(1, cache_policy), INTERNALS["policy"])
                by_path[cache_policy] = dict(
                    cache_policy=type(policy).__name__,
                    cache_policy_module_path=type(policy).__module__,
                )
            kwargs.update(by_path[cache_policy])
        if not policy_by_path:
            return _build(cls, size, num_chunks, kwargs)
        # vLLM logs a warning for each out-of-tree policy; the gate's output is not its place
        logging.disable(logging.WARNING)
        try:
            return _build(cls, size, num_chunks, kwargs)
        finally:
            logging.disable(logging.NOTSET)

    factory.__name__ = getattr(cls, "__name__", "factory")
    # a patched class may carry its fixes to the connector and the scheduler beside it
    # (engine.py applies them)
    factory.mend_connector = getattr(cls, "mend_connector", None)  # type: ignore[attr-defined]
    factory.mend_scheduler = getattr(cls, "mend_scheduler", None)  # type: ignore[attr-defined]
    factory.TAKES = frozenset(  # type: ignore[attr-defined]
        n
        for n, p in (("policy_by_path", "cache_policy_module_path"), ("info", "info"))
        if p in params
    )
    return factory


def _build(cls: Callable[..., Any], size: str | None, num_chunks: int, kwargs: dict) -> Any:
    """``cls`` built with ``num_chunks`` under its size argument's name (first where none)."""
    if size is None:
        return cls(num_chunks, **kwargs)
    return cls(**{size: num_chunks}, **kwargs)


def describe(
    spec: str,
    cls: Any,
    missing: frozenset[str],
    recency: str | None,
    uninspectable: list[str],
    learned: dict[str, Any] | None = None,
) -> str:
    """One line for the report: which manager, which vLLM, how it is checked, and what was
    learnt of the release (where its tracker counts, its lookup's answers, its policy answer,
    whether its contexts hold positions, a threshold wrapper)."""
    version = installed_vllm_version()
    name = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}"
    parts = [f"{spec}: {name}", f"vLLM {version}" if version else "vLLM not installed"]
    learned = learned or {}
    if learned.get("wrapper"):
        parts.append(f"threshold in {learned['wrapper']}")
    if learned.get("feed"):
        parts.append(f"tracker fed at {learned['feed']}s")
    if learned.get("lookup_bool"):
        parts.append("lookup answers a bool or None")
    if learned.get("blind"):
        parts.append(
            f"{', '.join(sorted(learned['blind']))} take no request context (called without one)"
        )
    if learned.get("metadata_events") is False:
        parts.append("no metadata-only events")
    if learned.get("offload_policy") is not None:
        parts.append(f"on_new_request answers {learned['offload_policy']}")
    if learned.get("positions") is False:
        parts.append("contexts hold no key positions")
    if recency:
        parts.append(f"{recency}-scoped recency" if recency == "request" else "touch-based recency")
    if learned.get("adopted"):
        parts.append(
            "its evictions and chunk ids adopted once legal (a policy spec §4.7 does not describe)"
        )
    parts.append(
        "lacks " + ", ".join(sorted(missing)) + " (never drawn)"
        if missing
        else "has every optional call"
    )
    if uninspectable:
        parts.append("cannot inspect " + ", ".join(uninspectable))
    return "; ".join(parts)


def manager_module() -> Any:
    """The installed vLLM's module of ``CPUOffloadingManager``; ``TargetError`` (one line)
    where vLLM is not importable, or predates that module (0.18: one manager per policy, whose
    interface ``older_interface`` reads from the abstract class's signatures)."""
    try:
        return importlib.import_module(VLLM_MANAGER)
    except Exception as exc:
        first = exc
    try:
        base = importlib.import_module(TYPE_HOMES[1]).OffloadingManager
    except Exception:
        base = None
    older = older_interface(base) if base is not None else ""
    if older:
        raise TargetError(f"{older} (it has no {VLLM_MANAGER})")
    raise TargetError(f"target 'vllm': vLLM is not importable ({_one_line(first)}); {INSTALL_HINT}")


def resolve_vllm(spec: str, types: VllmTypes | None = None, foreign: bool = False) -> Target:
    """``vllm`` or ``vllm=MODULE:ATTR`` -> a ``Target`` (exact unless ``foreign``);
    ``TargetError`` (one line) when vLLM or the class cannot be imported, or its recency
    semantics cannot be told.

    Types: ``types`` if given; for ``vllm=MODULE:ATTR``, the module's own ``ReqContext`` and
    ``make_offload_key`` when it defines both (a self-contained manager, or a stand-in in
    tests), else the installed vLLM's.
    """
    name = f"foreign={spec}" if foreign else spec
    if spec == "vllm":
        module = manager_module()
        cls = getattr(module, VLLM_MANAGER_CLASS, None)
        if cls is None:
            raise TargetError(
                f"target 'vllm': {VLLM_MANAGER} has no {VLLM_MANAGER_CLASS} "
                "(an older or newer vLLM than this adapter knows)"
            )
        if types is None:
            older = older_interface(cls)
            if older:
                raise TargetError(older)
            types = vllm_types()
    elif spec.startswith("vllm="):
        path = spec.split("=", 1)[1]
        cls = import_attr(path)
        if types is None:
            module = importlib.import_module(path.partition(":")[0])
            if hasattr(module, "ReqContext") and hasattr(module, "make_offload_key"):
                types = VllmTypes.from_module(module)
            else:
                types = vllm_types()
    else:
        raise TargetError(f"target {spec!r} is not 'vllm' or 'vllm=MODULE:ATTR'")
    missing = check_interface(cls, VllmAdapter.INTERFACE) if isinstance(cls, type) else frozenset()
    wrapper = threshold_wrapper(cls) if spec == "vllm" else None
    factory = vllm_factory(cls, name, wrapper)
    blind = calls_without_context(cls) if isinstance(cls, type) else None
    if blind and "prepare_store" in blind:
        raise TargetError(no_request_line(spec, cls, blind))
    if isinstance(cls, type) and lookup_answers_length(cls):
        raise TargetError(
            f"target {spec!r}: {cls.__module__}.{cls.__qualname__}.lookup is declared to answer "
            f"{_lookup_returns(cls)} (how many of the keys, from the first, are offloaded); "
            "kvgate drives a lookup that answers each key, so nothing is checked"
        )
    learned: dict[str, Any] = dict(
        lookup_bool=lookup_answers_bool(cls),
        metadata_events=metadata_events(types),
        new_request_none=declares_none(cls, "on_new_request"),
    )
    if blind is not None:
        learned["blind"] = blind
    positions = VllmAdapter.holds_positions(types.ReqContext)
    try:  # capabilities that only a built manager shows
        probe = VllmAdapter(
            factory(4, cache_policy=POLICIES[0], store_threshold=2, max_tracker_size=4),
            types=types,
            **learned,
        )
    except TargetError:
        raise
    except Exception as exc:  # a constructor that raises: the machines report it (spec s9)
        recency, uninspectable = None, [f"anything (its constructor raised {_one_line(exc)})"]
    else:
        recency, uninspectable = recency_of(probe.inner), probe.uninspectable()
        missing = probe.missing
        learned.update(learn(probe, factory, types, learned))
        if recency is None and not foreign:
            raise TargetError(
                f"target {spec!r}: its policy has neither request-scoped hooks "
                f"({', '.join(REQUEST_HOOKS)}) nor touch, so its recency cannot "
                f"be modelled; check it as foreign={spec}"
            )
    # A vLLM policy without the request-scoped hooks (releases before 0.33.0) learns recency
    # its own way, which the spec does not describe for vLLM (spec §4.7 documents the
    # request-scoped one): its evictions and chunk ids are its own choices, checked for
    # legality and adopted (spec §9); the admission rule is still compared exactly.
    adopted = not foreign and recency == "touch"
    version = installed_vllm_version()
    note_learned = dict(learned, positions=positions, adopted=adopted)
    if wrapper is not None:
        note_learned["wrapper"] = f"{wrapper.__module__}.{wrapper.__qualname__}"
    return Target(
        name,
        factory,
        POLICIES,
        foreign=foreign or adopted,
        adapter=VllmAdapter.with_types(types, **learned),
        missing=missing,
        note=describe(name, cls, missing, recency, uninspectable, note_learned),
        recencies=(recency,) if recency else ("touch",),
        kvgate_interface=False,
        feed=learned.get("feed", "offer"),
        positions=positions,
        release=f"vLLM {version}" if spec == "vllm" and version else name,
    )


def older_interface(cls: Any) -> str:
    """One line where the installed vLLM's manager predates the interface kvgate drives (every
    call names its request context, the types in ``vllm.v1.kv_offload.base``): which calls name
    no request, where the threshold lives, and that nothing is checked; "" otherwise."""
    if types_module() is not None:
        return ""
    calls = ("lookup", "prepare_load", "touch", "complete_load", "prepare_store", "complete_store")
    blind = []
    for call in calls:
        try:
            params = inspect.signature(getattr(cls, call)).parameters
        except (AttributeError, TypeError, ValueError):
            continue
        if "req_context" not in params:
            blind.append(f"{call}({', '.join(p for p in params if p != 'self')})")
    wrapper = THRESHOLD_WRAPPER[1] if importlib.util.find_spec(THRESHOLD_WRAPPER[0]) else ""
    where = (
        f"its store threshold lives in {wrapper} ({THRESHOLD_WRAPPER[0]}), "
        if wrapper
        else "it has no store threshold, "
    )
    return (
        f"vLLM {installed_vllm_version()}: {where}and its calls "
        f"{'; '.join(blind) or '(all of them)'} name no request context (no ReqContext in "
        f"{' or '.join(TYPE_HOMES)}); kvgate drives managers whose every call names its request, "
        "so the admission rule (spec A2, A3) is not judged on this release: nothing is checked"
    )


def no_request_line(spec: str, cls: Any, blind: frozenset[str]) -> str:
    """One line for a manager whose ``prepare_store`` names no request (read from its
    signature): the admission rule counts per request (spec A2, A3), so nothing is judged."""
    name = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}"
    return (
        f"target {spec!r}: {name}'s calls {', '.join(sorted(blind))} name no request context "
        "(read from their signatures); kvgate judges the admission rule per request (spec A2, "
        "A3), which needs prepare_store to name its request: nothing is checked"
    )


def declares_none(cls: Any, call: str) -> bool:
    """Whether ``cls.call`` is declared to answer nothing (``-> None``)."""
    try:
        annotation = inspect.signature(getattr(cls, call)).return_annotation
    except (AttributeError, TypeError, ValueError):
        return False
    return annotation is None or annotation == "None"


def threshold_wrapper(cls: Any) -> Callable[..., Any] | None:
    """The release's threshold wrapper, where its manager takes no ``store_threshold`` and the
    wrapper exists (found by what is there, never by the version); else None."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return None
    if "store_threshold" in params:
        return None
    module_name, attr = THRESHOLD_WRAPPER
    try:
        return getattr(importlib.import_module(module_name), attr, None)
    except Exception:
        return None


def metadata_events(types: VllmTypes) -> bool:
    """Whether the release's event type has ``metadata_only`` (a failed store's removal is
    announced); an event type without it (before 0.33.0) announces none, and none is expected."""
    try:
        event = getattr(importlib.import_module(types.source), "OffloadingEvent", None)
    except Exception:
        event = None
    fields = getattr(event, "__dataclass_fields__", None)
    return fields is None or "metadata_only" in fields


def _lookup_returns(cls: Any) -> str:
    """The text of ``cls.lookup``'s declared answer type ("" where it declares none)."""
    try:
        annotation = inspect.signature(cls.lookup).return_annotation
    except (AttributeError, TypeError, ValueError):
        return ""
    if annotation is inspect.Signature.empty:
        return ""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return text or str(annotation)


def lookup_answers_length(cls: Any) -> bool:
    """Whether ``lookup`` is declared to answer a prefix length over many keys (``int | None``,
    an upstream version between 0.19 and 0.20 that named the request first), not a per-key
    answer: an interface kvgate does not drive."""
    text = _lookup_returns(cls)
    return "int" in text.replace("LookupResult", "") and "bool" not in text


def lookup_answers_bool(cls: Any) -> bool:
    """Whether the class's ``lookup`` is declared to answer a bool (or None), as releases
    before 0.25.0 do, rather than a ``LookupResult``."""
    try:
        annotation = inspect.signature(cls.lookup).return_annotation
    except (AttributeError, TypeError, ValueError):
        return False
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    text = text or str(annotation)
    return "bool" in text and "LookupResult" not in text


def learn(probe: VllmAdapter, factory: Callable[..., Any], types: VllmTypes, learned: dict):
    """What only a fresh manager's answers show: where its tracker counts (one lookup with a
    fresh context, T = 2: a key counted there means fed at lookups, spec §3.2) and which
    offloading policy ``on_new_request`` answers (the release's documented choice)."""
    found: dict[str, Any] = {"feed": "offer"}
    fresh = VllmAdapter(
        factory(4, cache_policy=POLICIES[0], store_threshold=2, max_tracker_size=4),
        types=types,
        **learned,
    )
    key = b"kvgate-probe" + bytes(4)
    try:
        fresh.lookup(key, fresh.new_context("kvgate-probe"))
        if fresh.tracker_items():
            found["feed"] = "lookup"
    except Exception:  # the machines meet and report whatever it raises
        pass
    if "on_new_request" not in probe.missing:
        try:
            found["offload_policy"] = probe.on_new_request(probe.new_context("kvgate-probe"))
        except Exception:
            pass
    return found
