"""SGLang 0.5.20: a request's insert at finish counts again on what its prefill inserted
(spec §11).

Plain Python against the installed release's hierarchical cache, no kvgate. Under
``write_through_selective`` a radix node is copied to host once two inserts have counted on it.
0.5.20 keeps one request from counting twice only for the chunks of a chunked prefill (the
``chunked`` flag of ``cache_unfinished_req``, and SGLang's comment on the prompt re-insert: "the
same self-referencing inflation `chunked` exists to suppress"); the insert that ends prefill
and the insert at finish (``cache_finished_req``) both count. So one request that prefills and
finishes takes its prompt's nodes to 2, and they are backed up as if two requests had shared
them.

The cache is built on a CPU as ``init_hicache`` sets it up, its copies to host only recorded
(sglang_stand_ins.py beside it). Exit 1 (and one line) when the release copies the prompt of
the one request, 0 when it does not. Run it in a release environment:
``.sglang/0.5.20/bin/python docs/repro/sglang_0_5_20_finish_counts_again.py``.
"""

import os
import sys
from array import array

from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang_stand_ins import unified_cache

CORE = sys.argv[1] if len(sys.argv) > 1 else "python"  # or "rust", the default core
os.environ["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] = CORE  # read when the cache is built


rows, slots, cache, controller = unified_cache()


def admit(req):
    """The scheduler's admission: the prefix match, a row, the matched slots, the lock."""
    req.init_next_round_input(cache)
    rows.alloc([req])
    matched = len(req.prefix_indices)
    if matched:
        rows.write((req.kv.req_pool_idx, slice(0, matched)), req.prefix_indices)
    req.lock_receipt = cache.inc_lock_ref(req.last_node).to_dec_params()
    req.kv.kv_allocated_len = req.kv.kv_committed_len = matched
    return matched


def prefill(req, end):
    """Compute the prompt up to ``end`` in one chunk and cache the request, as the scheduler
    does when prefill ends."""
    start = req.kv.kv_committed_len
    rows.write((req.kv.req_pool_idx, slice(start, end)), slots.alloc(end - start))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = end
    req.set_extend_range(start, end)
    maybe_cache_unfinished_req(req, cache)
    cache.writing_check()


a = Req("A", "", array("q", [200, 200]), SamplingParams(max_new_tokens=1))
admit(a)
prefill(a, 2)
print(f"A prefills [200 200]: copies to host {controller.copied}")
a.finished_reason = FINISH_LENGTH(length=0)
release_kv_cache(a, cache)
cache.writing_check()
print(f"A finishes: copies to host {controller.copied} ({CORE} tree core)")
if controller.copied:
    print("reproduced: one request's prompt was backed up at threshold 2")
    sys.exit(1)
print("not reproduced: the finished request counted once")
