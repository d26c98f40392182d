"""SGLang 0.5.18's HiRadixCache: a request's insert at finish counts again on what its prefill
inserted (spec §11).

Plain Python against the installed release's ``HiRadixCache`` (what 0.5.18 builds for
``--enable-hierarchical-cache`` on a dense model), no kvgate. Under ``write_through_selective``
a node is copied to host once two inserts have counted on it (``_inc_hit_count``). Only the
chunks before the last are left out (``chunked``); the insert that ends prefill and the insert
at finish both count, so one request that prefills and finishes backs its own prompt up.

The cache's constructor builds a CUDA host pool and controller; here those two names in SGLang's
module are stood in for while it runs (a controller that records each copy, a host pool that is a
free list: sglang_stand_ins.py beside it), and a one-process ``gloo`` group answers its group size.
Exit 1 (and one line) when the release copies the prompt of the one request, 0 when it does not. Run
it in a release environment:
``.sglang/0.5.18/bin/python docs/repro/sglang_0_5_18_hiradix_finish_counts_again.py``.
"""

import json
import os
import sys
import tempfile
from array import array

import torch.distributed as dist
from sglang.srt import runtime_context
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ReqKvInfo
from sglang.srt.mem_cache import hiradix_cache
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs
from sglang_stand_ins import CopyRecorder, HostPool, cpu_pools


class Controller(CopyRecorder):
    def reset(self):
        self.ack_write_queue.clear()
        self.ack_load_queue.clear()


folder = tempfile.mkdtemp()  # 0.5.18's server arguments read a model config: a one-layer Llama
with open(os.path.join(folder, "config.json"), "w") as out:
    json.dump(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "num_attention_heads": 1, "num_key_value_heads": 1, "num_hidden_layers": 1,
         "intermediate_size": 64, "vocab_size": 512, "max_position_embeddings": 256},
        out,
    )  # fmt: skip
args = ServerArgs(
    model_path=folder,
    enable_hierarchical_cache=True,
    hicache_write_policy="write_through_selective",
    device="cpu",
)
runtime_context._CONTEXT.set_server_args(args)
dist.init_process_group(
    "gloo", init_method=f"file://{folder}/rendezvous", rank=0, world_size=1
)  # fmt: skip
rows, slots = cpu_pools(TokenToKVPoolAllocator, need_sort=False)
host = HostPool(64)
controller = Controller(host)
hiradix_cache.HiCacheController = lambda *a, **k: controller
hiradix_cache.get_mha_host_pool_cls = lambda kv_cache: lambda *a, **k: host
hiradix_cache.get_allocator_type = lambda server_args: None
cache = hiradix_cache.HiRadixCache(
    params=CacheInitParams(
        disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=slots, page_size=1
    ),
    server_args=args,
)
print(f"HiRadixCache built: write_through_threshold = {cache.write_through_threshold}")

a = Req("A", "", array("q", [200, 200]), SamplingParams(max_new_tokens=1))
a.init_next_round_input(cache)  # the prefix match: nothing yet
rows.alloc([a])
cache.inc_lock_ref(a.last_node)
rows.write((a.req_pool_idx, slice(0, 2)), slots.alloc(2))  # prefill computes both tokens
a.kv_committed_len = 2
a.kv = ReqKvInfo(kv_allocated_len=2, swa_evicted_seqlen=0)
a.set_extend_range(0, 2)
maybe_cache_unfinished_req(a, cache)  # what the scheduler does when prefill ends
cache.writing_check()
print(f"A prefills [200 200]: copies to host {controller.copied}")
a.finished_reason = FINISH_LENGTH(length=0)
release_kv_cache(a, cache)  # the insert at finish
print(f"A finishes: copies to host {controller.copied}")
if controller.copied:
    print("reproduced: one request's prompt was backed up at threshold 2")
    sys.exit(1)
print("not reproduced: the finished request counted once")
