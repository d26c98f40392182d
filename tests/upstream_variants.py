"""Known-bad variants of vLLM 0.34.0's manager, each breaking one thing that only the newer
exact checks see (tests/test_upstream.py shows each one caught): built on
``releases.vllm_mends.SkipCountedOnce``, which passes every machine, so that the one thing
is all that differs. The module imports vLLM when it is loaded.
"""

from __future__ import annotations

from vllm.v1.kv_offload.cpu.common import CPUOffloadingMetrics

from releases.vllm_mends import SkipCountedOnce


def _never() -> None:
    """A compaction that does nothing."""


class UsageOneWithoutChunks(SkipCountedOnce):
    """Reports its tier as full when it has no chunks at all (the zero-chunk twin sees it)."""

    def __init__(self, num_chunks, *args, **kwargs):
        super().__init__(num_chunks, *args, **kwargs)
        self.no_chunks = num_chunks == 0

    def get_stats(self):
        stats = super().get_stats()
        if self.no_chunks:
            stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, 1.0)
        return stats


class PolicyPathIgnored(SkipCountedOnce):
    """Builds LRU whenever a policy is named by module path (the out-of-tree spelling)."""

    def __init__(self, *args, cache_policy="lru", cache_policy_module_path=None, **kwargs):
        if cache_policy_module_path is not None:
            cache_policy = "lru"
        super().__init__(*args, cache_policy=cache_policy, **kwargs)


class InfoDropped(SkipCountedOnce):
    """Publishes nothing about its tier (``config_info``) whatever the spec told it."""

    def __init__(self, *args, info=None, **kwargs):
        super().__init__(*args, **kwargs)


class HeapNeverCompacted(SkipCountedOnce):
    """Its LRU policy never compacts its lazy heap: every entry a rank change or a chunk that
    becomes evictable again leaves behind stays until an eviction pops it. Every answer is
    right; only the heap grows with the number of calls (spec §4.8)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if hasattr(self._policy, "_maybe_compact_heap"):  # LRU; ARC keeps no heap
            self._policy._maybe_compact_heap = _never


# The four manager mutants of issue 48: each answers what its interface does not allow, and
# kvgate once reported the adapter's crash on it as its own bug; each is the target's
# counterexample (tests/test_upstream.py).
class SpecHelperNone(SkipCountedOnce):
    """Its load/store spec helper returns ``None``: a store's output carries no spec."""

    def _get_load_store_spec(self, keys, chunks):
        return None


class PrepareLoadNothing(SkipCountedOnce):
    """``prepare_load`` returns nothing (the call's return dropped)."""

    def prepare_load(self, keys, req_context):
        super().prepare_load(keys, req_context)


class InnerPrepareLoadNone(SkipCountedOnce):
    """The internal ``_prepare_load`` returns ``None``, which ``prepare_load`` passes on."""

    def _prepare_load(self, keys, req_context, **kwargs):
        super()._prepare_load(keys, req_context, **kwargs)


class ConfigInfoNothing(SkipCountedOnce):
    """``config_info()`` returns nothing."""

    def config_info(self):
        super().config_info()
