"""SGLang's ``HiRadixCache`` built on a CPU: what ``--enable-hierarchical-cache`` builds for a
dense model from 0.4.x up to 0.5.18 (spec §11).

Its constructor builds the host pool and the cache controller itself, both of which need CUDA
(pinned memory, streams, transfer kernels). Only those two are stood in for, for the time of
the constructor, as names in SGLang's module (those the release has): the controller is the
copy recorder (``recorder.py``) and the host pool is the recorder's own free list. The tree,
its counting and its policy are SGLang's code. The cache asks the size of its tensor-parallel
group, so a one-process ``gloo`` group is started once if none is.
"""

from __future__ import annotations

import importlib
import inspect
import os
import tempfile
from typing import Any

MODULE = "sglang.srt.mem_cache.hiradix_cache"
CONTROLLER_NAMES = ("HiCacheController", "get_mha_host_pool_cls", "get_allocator_type")
HOST_POOL_CLASS = "MHATokenToKVPoolHost"  # 0.4.x: the host pool class, named in the module


class _HostPool:
    """The host pool the cache holds beside its controller: the recorder's free list."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.size = pool.size
        self.page_size = 1

    def available_size(self) -> int:
        return self.pool.available_size()

    def free(self, slots) -> int:
        return self.pool.free(slots)

    def clear(self) -> None:
        self.pool.clear()

    def update_synced(self, host_indices) -> None:
        """0.4.x marks host slots in step with the GPU again when a node comes back: no
        state here to mark."""


def one_process_group() -> None:
    """A ``gloo`` group of one process, where no process group exists yet."""
    import torch.distributed as dist

    if dist.is_available() and not dist.is_initialized():
        where = os.path.join(tempfile.mkdtemp(prefix="kvgate-gloo-"), "rendezvous")
        dist.init_process_group("gloo", init_method=f"file://{where}", rank=0, world_size=1)


def build_hiradix(params: Any, server_args: Any, recorder: Any, allocator: Any) -> Any:
    """A ``HiRadixCache`` whose controller is ``recorder`` (SGLang's class, unchanged). Its
    constructor takes a parameters record and the server arguments (0.5.x), or the pools and
    the HiCache settings one by one (0.4.x: from the server arguments, as its scheduler does)."""
    module: Any = importlib.import_module(MODULE)
    one_process_group()
    recorder.mem_pool_device_allocator = allocator
    host = _HostPool(recorder.mem_pool_host.pool)
    stand_ins = {
        "HiCacheController": lambda *args, **kwargs: recorder,
        "get_mha_host_pool_cls": lambda kv_cache: lambda *args, **kwargs: host,
        "get_allocator_type": lambda server_args: None,
        HOST_POOL_CLASS: lambda *args, **kwargs: host,
    }
    saved = {name: getattr(module, name) for name in stand_ins if hasattr(module, name)}
    for name in saved:
        setattr(module, name, stand_ins[name])
    takes = inspect.signature(module.HiRadixCache).parameters
    try:
        if "params" in takes:
            return module.HiRadixCache(params=params, server_args=server_args)
        import torch.distributed as dist

        settings = {
            name: getattr(server_args, name)
            for name in takes
            if name.startswith("hicache_") and hasattr(server_args, name)
        }
        return module.HiRadixCache(
            req_to_token_pool=params.req_to_token_pool,
            token_to_kv_pool_allocator=params.token_to_kv_pool_allocator,
            tp_cache_group=dist.group.WORLD,
            page_size=params.page_size,
            **settings,
        )
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
