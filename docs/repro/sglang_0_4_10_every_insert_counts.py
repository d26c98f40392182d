"""SGLang 0.4.10's HiRadixCache: every insert counts, so one request's chunks and its finish
reach the selective threshold (3) on its own prompt (spec §11).

Plain Python against the installed release's ``HiRadixCache`` (what 0.4.10's scheduler builds
for ``--enable-hierarchical-cache``), no kvgate. Under ``write_through_selective`` a node is
copied to host once its ``hit_count`` reaches ``write_through_threshold``, 3
(``inc_hit_count``). ``_insert_helper`` calls ``inc_hit_count`` on every node an insert walks,
whoever inserts: the scheduler inserts a request at the end of each chunk of prefill
(``cache_unfinished_req``) and again at finish (``cache_finished_req``), so a prompt prefilled
in two chunks and finished counts three times on its first page.

The cache's constructor builds a CUDA host pool and controller; here those two names in SGLang's
module are stood in for while it runs (a controller that records each copy, a host pool that is a
free list: sglang_stand_ins.py beside it), and a one-process ``gloo`` group answers its group size.
Exit 1 (and one line) when the release copies the prompt of the one request, 0 when it does not. Run
it in a release environment (its start-up stands in for ``sgl_kernel``, the CUDA transfer kernels
the host pool's module imports):
``.sglang/0.4.10.post2/bin/python docs/repro/sglang_0_4_10_every_insert_counts.py``.
"""

import queue
import sys
import tempfile

import torch.distributed as dist
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
from sglang.srt.mem_cache import hiradix_cache
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang_stand_ins import CopyRecorder, HostPool, cpu_pools


class Controller(CopyRecorder):
    """Each copy acknowledged at once, on the queue the cache reads."""

    def __init__(self, host, device):
        super().__init__(host)
        self.mem_pool_device_allocator = device
        self.ack_write_queue, self.ack_load_queue = queue.Queue(), queue.Queue()

    def write(self, device_indices, node_id=None, **_):
        self.ack_write_queue.put(node_id)
        return super().write(device_indices, node_id)

    def reset(self):
        self.ack_write_queue, self.ack_load_queue = queue.Queue(), queue.Queue()


folder = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=0, world_size=1)
rows, slots = cpu_pools(TokenToKVPoolAllocator)
host = HostPool(64)
controller = Controller(host, slots)
hiradix_cache.HiCacheController = lambda *a, **k: controller
hiradix_cache.MHATokenToKVPoolHost = lambda *a, **k: host
cache = hiradix_cache.HiRadixCache(
    req_to_token_pool=rows, token_to_kv_pool_allocator=slots, tp_cache_group=dist.group.WORLD,
    page_size=1, hicache_ratio=2.0, hicache_size=0,
    hicache_write_policy="write_through_selective", hicache_io_backend="kernel",
    hicache_mem_layout="layer_first",
)  # fmt: skip
print(f"HiRadixCache built: write_through_threshold = {cache.write_through_threshold}")

a = Req("A", "", [200, 200], SamplingParams(max_new_tokens=2))
a.init_next_round_input(cache)  # the prefix match: nothing yet
a.req_pool_idx = rows.alloc(1)[0]
cache.inc_lock_ref(a.last_node)
for end in (1, 2):  # chunked prefill, one token a chunk: each chunk's KV, then its insert
    rows.write((a.req_pool_idx, slice(end - 1, end)), slots.alloc(1))
    a.fill_ids = [200, 200][:end]
    cache.cache_unfinished_req(a)  # stashing a chunk (scheduler), or the end of prefill
    cache.writing_check()
    print(f"A chunk [{end - 1}, {end}): copies to host {controller.copied}")
a.output_ids.append(300)  # the token it finishes on (its KV is never computed)
a.finished_reason = FINISH_LENGTH(length=1)
cache.cache_finished_req(a)  # the insert at finish
cache.writing_check()
print(f"A finishes: copies to host {controller.copied}")
if controller.copied:
    print("reproduced: one request's prompt was backed up at threshold 3")
    sys.exit(1)
print("not reproduced: the request counted once")
