"""What the SGLang reproductions beside it share: a host memory pool that is a free list, a
cache controller that records each device-to-host copy instead of doing it (the copy needs
CUDA; the decision to copy is SGLang's), and the CPU pools a cache is built on.

Not run on its own: each ``sglang_*.py`` here imports it (``python docs/repro/X.py`` puts this
folder on the path), in its release's environment.
"""

from types import SimpleNamespace

import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


class HostPool:
    """The host pool's slots, handed out and taken back (what each release asks of it)."""

    shared_allocation_domain = None

    def __init__(self, size):
        self.size, self.free_slots = size, list(range(size))

    def available_size(self):
        return len(self.free_slots)

    def alloc(self, n):
        taken, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return torch.tensor(taken, dtype=torch.int64)

    def free(self, slots):
        self.free_slots += [int(s) for s in slots]
        return len(slots)

    def update_synced(self, slots):
        pass

    def clear(self):
        self.free_slots = list(range(self.size))


class CopyRecorder:
    """The cache controller's device-to-host copy, recorded (its length, in ``copied``)
    instead of done."""

    write_policy = "write_through_selective"

    def __init__(self, host):
        self.mem_pool_host = host
        self.ack_write_queue, self.ack_load_queue, self.copied = [], [], []

    def write(self, device_indices, node_id=None, **_):
        self.copied.append(len(device_indices))
        return self.mem_pool_host.alloc(len(device_indices))


def cpu_pools(allocator, **allocator_args):
    """A request-to-token pool of 4 rows, a one-layer KV pool of 64 slots and its
    ``allocator`` (the release's ``TokenToKVPoolAllocator``), on the CPU."""
    rows = ReqToTokenPool(size=4, max_context_len=64, device="cpu", enable_memory_saver=False)
    kv = MHATokenToKVPool(
        size=64, page_size=1, dtype=torch.float16, head_num=1, head_dim=1, layer_num=1,
        device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    slots = allocator(size=64, dtype=torch.float16, device="cpu", kvcache=kv, **allocator_args)
    return rows, slots


class UnifiedController(CopyRecorder):
    """The controller ``init_hicache`` builds for 0.5.20's and later releases'
    ``UnifiedRadixCache``, its copies recorded; its host pool reached through an anchor."""

    enable_storage = False
    pp_prefetch_command_group = None

    def __init__(self):
        pool = HostPool(64)
        super().__init__(
            SimpleNamespace(
                anchor_entry=SimpleNamespace(host_pool=pool, host_evict_fn=None),
                available_size=pool.available_size,
                alloc=pool.alloc,
                free=pool.free,
            )
        )

    def start_writing(self):
        pass


def unified_cache(**params):
    """0.5.20's and later releases' ``UnifiedRadixCache`` on the CPU, set up as
    ``init_hicache`` does once its controller is built (a ``UnifiedController`` in its place);
    ``params``: the release's own cache parameters. The rows, the slots' allocator, the cache
    and its controller."""
    from sglang.srt import runtime_context
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs

    runtime_context._CONTEXT.set_server_args(
        ServerArgs(
            model_path="no-model",
            enable_hierarchical_cache=True,
            hicache_write_policy="write_through_selective",
            device="cpu",
        )
    )
    rows, slots = cpu_pools(TokenToKVPoolAllocator, need_sort=False)
    cache = UnifiedRadixCache(
        CacheInitParams(
            disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=slots, page_size=1,
            tree_components=(ComponentType.FULL,), **params,
        )
    )  # fmt: skip
    controller = cache.cache_controller = UnifiedController()
    cache.tree_core.set_hicache_enabled()
    cache.write_through_threshold = 2  # init_hicache: 2 under write_through_selective
    cache.is_write_back = False
    return rows, slots, cache, controller
