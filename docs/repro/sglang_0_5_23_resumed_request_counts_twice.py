"""SGLang 0.5.23: a retracted request counts again when it resumes (spec §11).

Plain Python against the installed release's hierarchical cache, no kvgate. Under
``write_through_selective`` a radix node is copied to host once two inserts have counted on it,
and SGLang counts each request once by a watermark: an insert counts on a node only past what
the same request inserted before (``req.kv.cache_inserted_len``). ``Req.reset_for_retract``
sets that watermark back to 0, so one request that is retracted and resumes counts twice, and
its prompt is backed up as if two requests had shared it.

The cache is built on a CPU as ``init_hicache`` sets it up, its copies to host only recorded
(sglang_stand_ins.py beside it). Exit 1 (and one line) when the release copies the prompt of
the one request, 0 when it does not. Run it in a release environment:
``.sglang/0.5.23/bin/python docs/repro/sglang_0_5_23_resumed_request_counts_twice.py``.
"""

import sys
from array import array

from sglang.srt.managers.schedule_batch import Req, release_req
from sglang.srt.mem_cache.common import checkpoint_kv_cache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang_stand_ins import unified_cache

CORE = sys.argv[1] if len(sys.argv) > 1 else "python"  # or "rust", the default core


rows, slots, cache, controller = unified_cache(tree_core_backend=CORE)


def admit(req):
    """The scheduler's admission: the prefix match, a row, the matched slots, the lock."""
    req.init_next_round_input(cache)
    rows.alloc([req])
    matched = int(req.prefix_len)
    if matched:
        rows.write(
            (req.kv.req_pool_idx, slice(0, matched)),
            cache.path_device_indices(req.last_node)[:matched],
        )
    req.lock = cache.lock(req.last_node)
    req.kv.kv_allocated_len = req.kv.kv_committed_len = matched
    return matched


def prefill(req, end):
    """Compute the prompt from what is cached up to ``end`` and checkpoint it into the tree."""
    start = req.kv.kv_committed_len
    rows.write((req.kv.req_pool_idx, slice(start, end)), slots.alloc(end - start))
    req.kv.kv_allocated_len = req.kv.kv_committed_len = end
    req.extend_end = end
    checkpoint_kv_cache(req, cache)
    cache.writing_check()


a = Req("A", "", array("q", [200, 200]), SamplingParams(max_new_tokens=3))
admit(a)
prefill(a, 2)
print(f"A prefills [200 200]: copies to host {controller.copied}")
release_req(
    req=a, remaing_req_count=0, req_to_token_pool=rows, token_to_kv_pool_allocator=slots,
    tree_cache=cache, hisparse_coordinator=None,
)  # fmt: skip
print(f"A is retracted: watermark cache_inserted_len = {a.kv.cache_inserted_len}")
print(f"A resumes: {admit(a)} token(s) matched on the GPU")
prefill(a, 2)
print(f"A prefills again: copies to host {controller.copied} ({CORE} tree core)")
if controller.copied:
    print("reproduced: one request's prompt was backed up at threshold 2")
    sys.exit(1)
print("not reproduced: the resumed request counted once")
