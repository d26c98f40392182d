"""vLLM 0.34.0: a request's first skip of a key it had earlier had admitted is never counted
(spec A5: the skip metric counts a key's skip once per request, at its first skip).

Plain Python against the installed release's manager, no kvgate. Threshold 2, a tracker of one
key. Request r1 offers B (skipped: count 1). Request r2 offers B and C: B reaches count 2 and is
admitted; C finds the tracker full of the offer's own keys and is skipped. r2's store of B
fails, and r2 offers A, which pushes B out of the tracker (A skipped). r2 is preempted and
resumes: it offers C, B, A again through the same context. B is absent and untracked now, so
r2 skips it: its first skip of B, which the metric must count. Skips by request: r1 {B},
r2 {C, A, B}: 4. 0.34.0 reports 3, because it dedups a skip by the keys the request has counted,
and r2 counted B when it admitted it. Exit 1 when the metric is not 4.
"""

import sys

from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

manager = CPUOffloadingManager(
    num_chunks=1, cache_policy="lru", enable_events=True, store_threshold=2, max_tracker_size=1
)
r1, r2 = ReqContext(req_id="r1"), ReqContext(req_id="r2")
A, B, C = (make_offload_key(name, 0) for name in (b"A", b"B", b"C"))

manager.prepare_store([B], r1)
stored = manager.prepare_store([C, B], r2)
assert list(stored.keys_to_store) == [B], stored
manager.prepare_store([A], r2)
manager.complete_store([B], r2, success=False)
manager.prepare_store([C, B, A], r2)  # r2 resumes after a preemption

stats = manager.get_stats().reduce()
skipped = next(
    v for k, v in stats.items() if str(getattr(k, "value", k)).endswith("stores_skipped")
)
print(f"stores_skipped = {skipped}; the rule says 4 (r1: B; r2: C, A, B)")
if skipped < 4:
    print("reproduced: r2's first skip of B, a key it had admitted before, was not counted")
    sys.exit(1)
if skipped > 4:
    print("not this defect, another: a request's repeated skips were counted again")
    sys.exit(1)
print("not reproduced: each request's first skip of each key was counted once")
