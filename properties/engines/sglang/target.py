"""The ``sglang`` target: the installed SGLang's hierarchical cache, found by capability.

What is found, never by version string: which cache class the release builds for
``--enable-hierarchical-cache`` on a dense model (``HiRadixCache`` where SGLang's cache registry
still constructs one, 0.5.18; else the unified radix cache), which tree cores it has
(Python, and the bundled Rust one where it loads), and the selective write-through threshold,
read from the line of SGLang's code that sets it. The cache is built on a CPU with SGLang's
own tree, policy and counting code; only its cache controller is the copy recorder
(``recorder.py``), attached as SGLang's ``init_hicache`` attaches its controller, with the
tree's HiCache switched on as ``init_hicache`` switches it. A release that cannot be judged
raises ``TargetError`` with one line saying why.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import tempfile
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, ClassVar

from kvgate.properties.adapters import TargetError

from .recorder import CopyRecorder

UNIFIED = "unified"  # unified_radix_cache.UnifiedRadixCache (its tree core Python or Rust)
CORES = ("python", "rust")
_CORE_VARIABLE = "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"
_THRESHOLD = re.compile(r'==\s*"write_through"\s+else\s+(\d+)')


@dataclass(frozen=True)
class SGLangTarget:
    """A resolved SGLang target (its own small record: kvgate's ``Target`` builds managers,
    this builds a tree cache and its scheduler).

    ``design`` names the counting the release's code has (``watermark``: a request's inserts
    count only past what it inserted before); ``cores`` the tree cores it can be built with;
    ``variant`` a known-bad or mended variant from ``variants.VARIANTS`` (``""``: as released).
    """

    engine: ClassVar[str] = "sglang"  # the gate plans only the sglang machine on it
    foreign: ClassVar[bool] = False  # every backup is judged exactly (spec §11)

    spec: str
    release: str
    cache_class: str
    design: str
    cores: tuple[str, ...]
    threshold: int
    variant: str = ""
    note: str = ""
    skip: tuple[str, ...] = field(default=())  # request-life steps not drawn (declared known)
    adapter: object = None  # what ``--known-defect`` would set: none is declarable here yet

    def __post_init__(self) -> None:
        if self.adapter is not None:
            raise TargetError(
                f"{self.spec}: --known-defect names vLLM's manager defects; none is declarable "
                "for SGLang's cache"
            )

    def unchecked(self) -> list[str]:
        """What the sglang machine does not check, each with why (for the report)."""
        parts = [
            "the disaggregated prefill/decode paths, host-memory eviction and loading back "
            "from host (the machine drives one aggregated scheduler's tree cache, page size 1)"
        ]
        if "rust" not in self.cores and self.cache_class != "HiRadixCache":
            parts.append("the Rust tree core (it does not load here, or the variant needs Python)")
        return parts

    def build(self, core: str, gpu_slots: int, host_slots: int, page_size: int):
        """A fresh cache with its scheduler (``scheduler.Scheduler``) on ``core``."""
        from .scheduler import Scheduler
        from .variants import VARIANTS

        sg = load_release()
        r2t = sg.ReqToTokenPool(
            size=16, max_context_len=256, device="cpu", enable_memory_saver=False
        )
        kv = sg.MHATokenToKVPool(
            size=gpu_slots, page_size=page_size, dtype=sg.torch.float16, head_num=1,
            head_dim=1, layer_num=1, device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        allocator = _call(
            sg.TokenToKVPoolAllocator,
            size=gpu_slots, dtype=sg.torch.float16, device="cpu", kvcache=kv, need_sort=False,
        )  # fmt: skip
        scheduler = Scheduler(sg, None, r2t, allocator, None, page_size)
        recorder = CopyRecorder(host_slots, scheduler.pages_of_slots)
        scheduler.recorder = recorder
        if sg.HiRadixCache is not None:
            from .hiradix import build_hiradix

            pools = {"req_to_token_pool": r2t, "token_to_kv_pool_allocator": allocator}
            params = (
                sg.CacheInitParams(disable=False, page_size=page_size, **pools)
                if sg.CacheInitParams  # 0.5.x: one parameters record
                else SimpleNamespace(page_size=page_size, **pools)  # 0.4.x: the arguments
            )
            scheduler.cache = build_hiradix(params, sg.server_args, recorder, allocator)
            return scheduler
        variant = VARIANTS[self.variant] if self.variant else None
        cache_cls = variant.cache(sg.UnifiedRadixCache) if variant else sg.UnifiedRadixCache
        # the tree core: a cache parameter (0.5.23), or an environment variable SGLang reads
        # when the cache is built (0.5.19-0.5.20)
        by_param = "tree_core_backend" in getattr(sg.CacheInitParams, "__dataclass_fields__", {})
        params = sg.CacheInitParams(
            disable=False, req_to_token_pool=r2t, token_to_kv_pool_allocator=allocator,
            page_size=page_size, tree_components=(sg.ComponentType.FULL,),
            **({"tree_core_backend": core} if by_param else {}),
        )  # fmt: skip
        before = os.environ.get(_CORE_VARIABLE)
        os.environ[_CORE_VARIABLE] = core
        try:
            cache = cache_cls(params)
        finally:
            if before is None:
                os.environ.pop(_CORE_VARIABLE, None)
            else:
                os.environ[_CORE_VARIABLE] = before
        if variant:
            variant.core(cache.tree_core)
        scheduler.cache = cache
        # what init_hicache does once its controller is built, with the recorder in its place
        cache.cache_controller = recorder
        cache.tree_core.set_hicache_enabled()
        cache.write_through_threshold = self.threshold
        cache.is_write_back = False
        return scheduler


_LOADED: SimpleNamespace | None = None


def _call(cls, **kwargs):
    """``cls(**kwargs)`` with only the keywords its constructor takes (an older release's pool
    takes fewer, e.g. no ``need_sort``)."""
    takes = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in kwargs.items() if k in takes})


def _module(*names: str):
    """The first of these modules the release has, or None (a module that moved)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError:
            continue
    return None


def _published():
    """SGLang's scheduler publishes its server arguments before it builds a cache; the cache's
    helpers read them (``get_disagg``, ``get_serving``)."""
    from sglang.srt.server_args import ServerArgs

    def server_args(model_path: str, **fixed):
        try:
            return ServerArgs(
                model_path=model_path,
                enable_hierarchical_cache=True,
                hicache_write_policy="write_through_selective",
                device="cpu",
                **fixed,
            )
        except ImportError:  # 0.4.x: sizing GPU memory imports the model's layers; a fixed size
            if fixed:
                raise
            return server_args(model_path, mem_fraction_static=0.5)

    hub: Any = importlib.import_module("huggingface_hub.constants")

    offline = hub.HF_HUB_OFFLINE
    hub.HF_HUB_OFFLINE = True  # no model is fetched, whatever the release reads
    try:
        args = server_args("kvgate-no-model")
    except OSError:  # a release that reads the model's config (0.5.18): a local one-layer one
        folder = tempfile.mkdtemp(prefix="kvgate-no-model-")
        with open(os.path.join(folder, "config.json"), "w") as out:
            json.dump(_NO_MODEL, out)
        args = server_args(folder)
    finally:
        hub.HF_HUB_OFFLINE = offline
    context = _module("sglang.srt.runtime_context")
    if context is not None:  # 0.4.x has none: its cache reads no published arguments
        context._CONTEXT.set_server_args(args)
    return args


# A model config for releases whose server arguments read one: a one-layer Llama, never loaded.
_NO_MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "num_attention_heads": 1, "num_key_value_heads": 1, "num_hidden_layers": 1,
    "intermediate_size": 64, "vocab_size": 512, "max_position_embeddings": 256,
    "torch_dtype": "float16",
}  # fmt: skip


def load_release() -> SimpleNamespace:
    """The installed SGLang's modules and functions the harness calls, imported once."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    import logging
    import warnings

    import torch

    warnings.filterwarnings("ignore", message="Only CUDA")
    logging.getLogger("sglang").setLevel(logging.WARNING)
    import sglang

    mc = "sglang.srt.mem_cache"
    built = _cache_for_a_dense_model(mc)
    try:
        module = "hiradix_cache" if built == "HiRadixCache" else "unified_radix_cache"
        cache_cls = getattr(importlib.import_module(f"{mc}.{module}"), built)
    except (ModuleNotFoundError, AttributeError):
        raise TargetError(
            f"sglang {sglang.__version__}: no {built} ({mc}.{module}) for the hierarchical "
            "cache of a dense model"
        ) from None
    batch = importlib.import_module("sglang.srt.managers.schedule_batch")
    # the scheduler's cache helpers (0.5.x); 0.4.x calls the cache's methods itself
    common = _module(f"{mc}.common") or SimpleNamespace()
    params = _module(f"{mc}.cache_init_params")
    components = _module(f"{mc}.unified_cache.component_type")
    server_args = _published()
    _LOADED = SimpleNamespace(
        version=sglang.__version__,
        torch=torch,
        server_args=server_args,
        cache_class=built,
        UnifiedRadixCache=cache_cls if built == "UnifiedRadixCache" else None,
        HiRadixCache=cache_cls if built == "HiRadixCache" else None,
        ReqKvInfo=getattr(batch, "ReqKvInfo", None),
        Req=batch.Req,
        FINISH_LENGTH=batch.FINISH_LENGTH,
        FINISH_ABORT=batch.FINISH_ABORT,
        # a retraction: one function (0.5.x), or inline in ``ScheduleBatch.retract_decode``
        release_req=getattr(batch, "release_req", None),
        ScheduleBatch=batch.ScheduleBatch,
        global_config=_module("sglang.global_config"),
        SamplingParams=importlib.import_module(
            "sglang.srt.sampling.sampling_params"
        ).SamplingParams,
        # how a chunk's KV enters the tree: a checkpoint (0.5.23), or caching the unfinished
        # request, ``chunked`` for a chunk before the last (0.5.19-0.5.20)
        checkpoint_kv_cache=getattr(common, "checkpoint_kv_cache", None),
        maybe_cache_unfinished_req=getattr(common, "maybe_cache_unfinished_req", None),
        release_kv_cache=getattr(common, "release_kv_cache", None),
        evict_from_tree_cache=getattr(common, "evict_from_tree_cache", None),
        ReqToTokenPool=importlib.import_module(f"{mc}.memory_pool").ReqToTokenPool,
        MHATokenToKVPool=importlib.import_module(f"{mc}.memory_pool").MHATokenToKVPool,
        TokenToKVPoolAllocator=_module(
            f"{mc}.allocator.token", f"{mc}.allocator"
        ).TokenToKVPoolAllocator,
        CacheInitParams=getattr(params, "CacheInitParams", None),
        ComponentType=getattr(components, "ComponentType", None),
    )
    return _LOADED


def _cache_for_a_dense_model(mc: str) -> str:
    """Which class SGLang's cache registry builds for ``--enable-hierarchical-cache`` and a
    plain (dense, full-attention) model: ``HiRadixCache`` where its default factory still
    constructs one (0.5.18: the unified cache only for hybrid models), else the unified one.
    With no registry (0.4.x) the scheduler builds the cache itself: its source says which."""
    try:
        registry = importlib.import_module(f"{mc}.registry")
    except ModuleNotFoundError:
        where = importlib.util.find_spec("sglang.srt.managers.scheduler")
        if where is None or where.origin is None:
            return "UnifiedRadixCache"
        with open(where.origin) as source:
            return "HiRadixCache" if "HiRadixCache(" in source.read() else "UnifiedRadixCache"
    factory = getattr(registry, "default_radix_cache_factory", None)
    if factory is not None and "HiRadixCache(" in inspect.getsource(factory):
        return "HiRadixCache"
    return "UnifiedRadixCache"


def _threshold(sg: SimpleNamespace) -> int:
    where = sg.HiRadixCache.__init__ if sg.HiRadixCache else sg.UnifiedRadixCache.init_hicache
    match = _THRESHOLD.search(inspect.getsource(where))
    if match is None:
        raise TargetError(
            f"sglang {sg.version}: no selective write-through threshold in {where.__qualname__}"
        )
    return int(match.group(1))


def _design(sg: SimpleNamespace) -> str:
    """How the release counts, read from its code: a per-request watermark (the insert
    parameters carry ``inserted_len``, as in 0.5.23), a ``chunked`` flag that leaves out the
    chunks before the last (as in 0.5.20), or every insert."""
    base = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    params = getattr(base, "InsertParams", None)  # 0.4.x inserts a key and a value, no more
    fields = getattr(params, "__dataclass_fields__", {})
    if "inserted_len" in fields:
        return "watermark"
    if "chunked" in fields:
        return "chunked"
    return "every insert"


def _cores(sg: SimpleNamespace) -> tuple[str, ...]:
    found = []
    for core in CORES if sg.UnifiedRadixCache else ():
        try:
            scheduler = SGLangTarget("probe", sg.version, "", "", (core,), 2).build(
                core, gpu_slots=8, host_slots=8, page_size=1
            )
        except Exception:  # a core that does not build is one not found
            continue
        if core in type(scheduler.cache.tree_core).__name__.lower() or (
            core == "python" and "rust" not in type(scheduler.cache.tree_core).__name__.lower()
        ):
            found.append(core)
    if sg.HiRadixCache:  # one tree, in Python; built once to know it builds here
        SGLangTarget("probe", sg.version, "", "", ("python",), 2).build(
            "python", gpu_slots=8, host_slots=8, page_size=1
        )
        found.append("python")
    return tuple(found)


def resolve_sglang(spec: str = "sglang") -> SGLangTarget:
    """``sglang`` (the installed release, as released) or ``sglang+VARIANT`` (a known-bad or
    mended variant of it, ``variants.VARIANTS``)."""
    from .variants import VARIANTS

    name, _, variant = spec.partition("+")
    if name != "sglang":
        raise TargetError(f"{spec!r}: an SGLang target is 'sglang' or 'sglang+VARIANT'")
    if variant and variant not in VARIANTS:
        raise TargetError(f"{spec!r}: no variant {variant!r} (known: {', '.join(VARIANTS)})")
    try:
        sg = load_release()
    except TargetError:
        raise
    except ModuleNotFoundError as exc:
        raise TargetError(
            f"sglang is not importable here ({exc}); it lives in a release environment "
            "(docs/sglang.md)"
        ) from None
    except Exception as exc:  # an install that half imports: one line, no verdict
        what = " ".join(str(exc).split())[:200]
        raise TargetError(f"sglang does not import here: {type(exc).__name__}: {what}") from None
    if variant and not hasattr(sg.UnifiedRadixCache, "checkpoint_into_tree"):
        raise TargetError(
            f"{spec!r}: the variants hook UnifiedRadixCache.checkpoint_into_tree, which sglang "
            f"{sg.version} does not have"
        )
    threshold = _threshold(sg)
    design = _design(sg)
    cores = _cores(sg)
    if variant:
        cores = tuple(c for c in cores if c in VARIANTS[variant].cores)
    if not cores:
        raise TargetError(f"sglang {sg.version}: neither tree core builds on this machine")
    note = (
        f"sglang {sg.version}: {sg.cache_class}, tree cores {'+'.join(cores)}, "
        f"selective threshold {threshold}, counting: {design}"
    )
    if variant:
        note += f"; variant {variant}"
    return SGLangTarget(spec, sg.version, sg.cache_class, design, cores, threshold,
                        variant, note)  # fmt: skip
