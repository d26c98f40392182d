"""A patch to vLLM 0.34.0's manager, as a maintainer would offer it for review: the one place
where kvgate finds 0.34.0 wrong (spec A5) put right, everything else left as it is.

0.34.0 counts a skip only when the request had not *counted* the key before. A request whose
earlier offer admitted the key (the store then failed, or the key was evicted, and the tracker
dropped it) skips it on a later offer, and that skip is never counted. Spec A5 counts the
request's first *skip* of a key, per generation. ``SkipCountedOnce`` keeps its own record of the
keys each request has skipped, tied to this manager and its cache generation the way upstream's
own per-request record is, and adds the skips upstream left out. It is not vLLM's code: it wraps
the release's ``prepare_store`` and reads only its public calls and its tracker (``counts``).

Use: ``kvgate check --target vllm=tests.upstream_patches:SkipCountedOnce`` with vLLM 0.34.0
installed (the module imports vLLM when it is loaded).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager


@dataclass
class _SkippedByRequest:
    """The keys one request has skipped, in one generation of one manager."""

    owner: object
    generation: int
    keys: set = field(default_factory=set)


class SkipCountedOnce(CPUOffloadingManager):
    """vLLM's CPU manager, counting each request's first skip of a key (spec A5)."""

    def _skipped_by(self, req_context) -> _SkippedByRequest:
        generation = getattr(self, "_cache_generation", 0)
        record = req_context.get_state(_SkippedByRequest)
        if record is None or record.owner is not self or record.generation != generation:
            record = _SkippedByRequest(self, generation)
            req_context.set_state(record)
        return record

    def _keys_counted_by(self, req_context) -> set:
        # What upstream dedups its skip metric by; read before the call changes it.
        return set(self._get_request_cache_access(req_context).counted_keys)

    def prepare_store(self, keys, req_context):
        keys = list(keys)
        if self.counts is None:
            return super().prepare_store(keys, req_context)
        counted_before = self._keys_counted_by(req_context)
        absent = [
            k for k in dict.fromkeys(keys) if self.lookup(k, req_context) == LookupResult.MISS
        ]
        out = super().prepare_store(keys, req_context)
        skipped = self._skipped_by(req_context)
        for key in absent:
            if self.counts.get(key, 0) >= self.store_threshold or key in skipped.keys:
                continue  # admitted, or this request's skip of it was counted already
            skipped.keys.add(key)
            if key in counted_before:  # upstream did not count this first skip
                self.stores_skipped_in_current_batch += 1
        return out
