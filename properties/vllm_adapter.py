"""Reaching a manager that follows vLLM's interface (SPEC section 10), for the ``vllm`` and
``vllm=MODULE:ATTR`` targets.

``vllm`` is the installed vLLM's ``CPUOffloadingManager``; ``vllm=MODULE:ATTR`` is any class
with vLLM's interface (a patched manager under review, or a stand-in in tests). Both are foreign
targets: their eviction and chunk-id choices are checked for legality and adopted (SPEC
section 9), everything the admission rule fixes is compared exactly.

``VllmAdapter`` turns vLLM's answers into the plain values every adapter gives the machines
(see ``properties.targets``): our keys are ``bytes`` (block hash + 4-byte big-endian group),
vLLM's come from ``make_offload_key(block_hash, group_idx)``, and the adapter keeps the mapping
back, so answers name our keys whatever type vLLM's keys are. Types are not imported by this
module at load time: they come in a ``VllmTypes`` (from ``vllm.v1.kv_offload.base``, or from the
module that defines the target class when it defines its own ``ReqContext`` and
``make_offload_key``), so the adapter can be tested without vLLM.

The adapter goes by capability, never by version (SPEC section 10): ``touch`` is optional (0.34.0
removed it; such a target's ``missing`` names it, machines never draw a touch and the report says
so), events may carry ``metadata_only``, ``removal_expected`` and ``req_context`` or not (only
keys, ``removed`` and ``metadata_only`` are read), ``ReqContext`` may have extra fields and
properties. Other tolerated differences: the constructor's size argument (``num_chunks`` or
``num_blocks``), ``ReqContext``'s extra fields, events without ``metadata_only`` (taken as
``False``), ``store_spec`` as an object with ``block_ids`` or a plain sequence, and stats whose
histogram reduces to a summary (samples are read from the unreduced ``metric_sections()``
where the stats object has it, else the metric is left out: the machine skips a metric a
foreign adapter cannot see).
"""
from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from kvgate.impl.base import (ALLOCATION_SIZE, CACHE_USAGE, GROUP_BYTES, READ_USAGE, STORES_SKIPPED,
                              WRITE_USAGE, LookupResult, OffloadingEvent, PrepareStoreOutput)

from .adapters import (POLICIES, CapabilityAdapter, Target, TargetError, check_interface,
                       import_attr)

VLLM_MANAGER = "vllm.v1.kv_offload.cpu.manager"
VLLM_MANAGER_CLASS = "CPUOffloadingManager"
VLLM_TYPES = "vllm.v1.kv_offload.base"
# What SPEC section 10 lists next to the CPU build of torch; the wheel itself goes in with
# --no-deps so that its CUDA dependency set stays out.
VLLM_CPU_PACKAGES = ("packaging psutil pyzmq urllib3 regex numpy transformers cbor2 aiohttp "
                     "requests openai-harmony openai pillow pybase64 cachetools msgspec "
                     "cloudpickle uvloop py-cpuinfo prometheus_client xgrammar fastapi "
                     "partial_json_parser llguidance")
INSTALL_HINT = ("install it next to the CPU build of torch: pip install --no-deps "
                "vllm==<version> && pip install " + VLLM_CPU_PACKAGES)


def installed_vllm_version() -> str | None:
    """The installed vLLM distribution's version, or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("vllm")
    except (ImportError, PackageNotFoundError):
        return None


def describe(spec: str, cls: Any, missing: frozenset[str]) -> str:
    """One line for the report: which manager, which vLLM, what the adapter found missing."""
    version = installed_vllm_version()
    name = f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}"
    parts = [f"{spec}: {name}", f"vLLM {version}" if version else "vLLM not installed"]
    parts.append("lacks " + ", ".join(sorted(missing)) + " (never drawn)" if missing
                 else "has every optional call")
    return "; ".join(parts)


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


def vllm_types() -> VllmTypes:
    """The installed vLLM's types; ``TargetError`` (one line: how to install) without it."""
    try:
        module = importlib.import_module(VLLM_TYPES)
    except Exception as exc:  # ImportError, or a dependency that fails while importing
        raise TargetError(f"vLLM is not importable ({_one_line(exc)}); {INSTALL_HINT}") from None
    return VllmTypes.from_module(module)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _name_of(result: Any) -> LookupResult:
    """``LookupResult.HIT`` (any enum) or ``"hit"`` -> kvgate's ``LookupResult.HIT``."""
    if isinstance(result, bool):
        return LookupResult.HIT if result else LookupResult.MISS
    return LookupResult(str(getattr(result, "name", result)).upper())


def _ids(spec: Any) -> list[int]:
    """Chunk ids of a load/store spec: an object with ``block_ids`` (a numpy array in vLLM)
    or a plain sequence."""
    ids = getattr(spec, "block_ids", spec)
    return [int(i) for i in ids]


class VllmAdapter(CapabilityAdapter):
    """A manager with vLLM's interface, answering in kvgate's plain values."""

    INTERFACE = "vLLM's manager interface"

    def __init__(self, manager, types: VllmTypes | None = None):
        super().__init__(manager)
        self.types = types or vllm_types()
        self._theirs: dict[bytes, Any] = {}  # our key -> vLLM's key
        self._ours: dict[Any, bytes] = {}  # vLLM's key -> our key
        self._ctx_kwargs = self._context_kwargs(self.types.ReqContext)

    @classmethod
    def with_types(cls, types: VllmTypes) -> Callable[[Any], VllmAdapter]:
        """An adapter constructor bound to ``types`` (what ``Target.adapter`` is called with)."""
        return partial(cls, types=types)

    # --- contexts and keys ---

    @staticmethod
    def _context_kwargs(ctx_cls) -> dict[str, Any]:
        try:
            params = inspect.signature(ctx_cls).parameters
        except (TypeError, ValueError):
            return {}
        return {"kv_transfer_params": None} if "kv_transfer_params" in params else {}

    def new_context(self, req_id: str):
        try:
            return self.types.ReqContext(req_id=req_id, **self._ctx_kwargs)
        except TypeError:
            return self.types.ReqContext(req_id)

    def set_position(self, ctx, key: bytes, position: int) -> None:
        ctx.set_offload_key_position(self._key(key), position)

    def position(self, ctx, key: bytes) -> int | None:
        get = getattr(ctx, "get_offload_key_position", None)
        return None if get is None else get(self._key(key))

    def _key(self, key: bytes) -> Any:
        theirs = self._theirs.get(key) if isinstance(key, bytes) else None
        if theirs is None:
            if not isinstance(key, bytes) or len(key) < GROUP_BYTES:
                return key  # not one of ours: let the manager answer it
            theirs = self.types.make_offload_key(key[:-GROUP_BYTES],
                                                 int.from_bytes(key[-GROUP_BYTES:], "big"))
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

    def lookup(self, key: bytes, ctx=None) -> LookupResult:
        return _name_of(self.manager.lookup(self._key(key), ctx))

    def prepare_load(self, keys, ctx=None) -> list[int]:
        return _ids(self.manager.prepare_load(self._keys(keys), ctx))

    def complete_load(self, keys, ctx=None) -> None:
        self.manager.complete_load(self._keys(keys), ctx)

    def touch(self, keys, ctx=None) -> None:
        self._lacks("touch")  # the oracle never asks; a direct caller gets one line
        self.manager.touch(self._keys(keys), ctx)

    def prepare_store(self, keys, ctx):
        out = self.manager.prepare_store(self._keys(keys), ctx)
        if out is None:
            return None
        return PrepareStoreOutput(self._backs(out.keys_to_store), _ids(out.store_spec),
                                  self._backs(out.evicted_keys))

    def complete_store(self, keys, ctx=None, success: bool = True) -> None:
        self.manager.complete_store(self._keys(keys), ctx, success=success)

    def reset_cache(self) -> None:
        self.manager.reset_cache()

    def take_events(self) -> list[OffloadingEvent]:
        # vLLM's take_events() is a generator: nothing is drained until it is iterated.
        return [OffloadingEvent(tuple(self._backs(e.keys)), bool(e.removed),
                                bool(getattr(e, "metadata_only", False)))
                for e in (self.manager.take_events() or ())]

    def get_stats(self) -> dict[str, Any]:
        stats = self.manager.get_stats()
        if stats is None:
            return {}
        if isinstance(stats, dict):
            raw = stats
        elif hasattr(stats, "reduce"):
            raw = stats.reduce() or {}
        elif hasattr(stats, "as_dict"):
            raw = stats.as_dict()
        else:
            return {}
        raw = {_metric_name(name): value for name, value in dict(raw).items()}
        out: dict[str, Any] = {}
        for name in (STORES_SKIPPED, CACHE_USAGE, WRITE_USAGE, READ_USAGE):
            value = raw.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[name] = value
        # reduce() may summarise the histogram (count and sum): read its samples unreduced.
        samples = _samples(raw.get(ALLOCATION_SIZE))
        if samples is None:
            samples = _raw_histogram(stats, ALLOCATION_SIZE)
        if samples is not None:
            out[ALLOCATION_SIZE] = samples
        return out

    # --- what the machine inspects ---

    def tracker_items(self) -> list[tuple[Any, int]] | None:
        counts = getattr(self.manager, "counts", None)
        if counts is None:
            return None
        return [(self._back(k), int(c)) for k, c in counts.items()]

    def free_chunks(self) -> None:
        return None  # foreign: the pool is the target's own

    def chunk_of(self, key: bytes) -> None:
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
    ``metric_sections()`` (types, then values: name -> {label values: samples}), or a dict
    attribute keyed by metric name. ``[]`` when such a store exists but has no sample of
    ``name``; ``None`` when the stats object keeps no samples at all."""
    stores: list[dict] = []
    sections = getattr(stats, "metric_sections", None)
    if callable(sections):
        try:
            stores += [s for s in sections() if isinstance(s, dict)]
        except Exception:
            pass
    for attr in ("histograms", "data"):
        store = getattr(stats, attr, None)
        if isinstance(store, dict):
            stores.append(store)
            if isinstance(store.get("data"), dict):
                stores.append(store["data"])
    if not stores:
        return None
    for store in stores:
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
    return [] if sections is not None else None


def vllm_factory(cls: Callable[..., Any], spec: str) -> Callable[..., Any]:
    """A factory ``(num_chunks, cache_policy, store_threshold, max_tracker_size)`` for a class
    with vLLM's constructor, whichever name its size argument has."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    size = next((n for n in ("num_chunks", "num_blocks") if n in params), None)
    if size is None and takes_any:
        size = "num_chunks"

    def factory(num_chunks: int, cache_policy: str = "lru", store_threshold: int = 1,
                max_tracker_size: int = 64_000):
        kwargs: dict[str, Any] = {}
        args: list[Any] = []
        if size is None:
            args.append(num_chunks)
        else:
            kwargs[size] = num_chunks
        wanted = dict(cache_policy=cache_policy, enable_events=True,
                      store_threshold=store_threshold, max_tracker_size=max_tracker_size)
        for name, value in wanted.items():
            if name in params or takes_any:
                kwargs[name] = value
            elif name == "store_threshold" and store_threshold >= 2:
                raise TargetError(f"target {spec!r} takes no store_threshold: it predates "
                                  "the admission rule")
            elif name == "enable_events":
                raise TargetError(f"target {spec!r} takes no enable_events: its events "
                                  "cannot be checked")
        return cls(*args, **kwargs)

    factory.__name__ = getattr(cls, "__name__", "factory")
    return factory


def resolve_vllm(spec: str, types: VllmTypes | None = None) -> Target:
    """``vllm`` or ``vllm=MODULE:ATTR`` -> a foreign ``Target``; ``TargetError`` (one line)
    when vLLM or the class cannot be imported.

    Types: ``types`` if given; for ``vllm=MODULE:ATTR``, the module's own ``ReqContext`` and
    ``make_offload_key`` when it defines both (a self-contained manager, or a stand-in in
    tests), else the installed vLLM's.
    """
    if spec == "vllm":
        try:
            module = importlib.import_module(VLLM_MANAGER)
        except Exception as exc:
            raise TargetError(f"target 'vllm': vLLM is not importable ({_one_line(exc)}); "
                              f"{INSTALL_HINT}") from None
        cls = getattr(module, VLLM_MANAGER_CLASS, None)
        if cls is None:
            raise TargetError(f"target 'vllm': {VLLM_MANAGER} has no {VLLM_MANAGER_CLASS} "
                              "(an older or newer vLLM than this adapter knows)")
        types = types or vllm_types()
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
    missing = (check_interface(cls, VllmAdapter.INTERFACE) if isinstance(cls, type)
               else frozenset())
    return Target(spec, vllm_factory(cls, spec), POLICIES, foreign=True,
                  adapter=VllmAdapter.with_types(types), missing=missing,
                  note=describe(spec, cls, missing))
