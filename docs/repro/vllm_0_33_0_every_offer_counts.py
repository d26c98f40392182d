"""vLLM 0.33.0: a request's own retry counts as a second offer (the seed's bug, spec A2).

Plain Python against the installed release's manager, no kvgate. With store_threshold 2 a key
must be offered by two different requests before it is stored. Here one request offers A, its
offer is not stored (A has count 1), and the same request offers A again, as the scheduler does
when it retries after ``prepare_store`` returned ``None`` or re-offers after a preemption.
Exit 1 (and one line) when the release admits A, 0 when it follows the rule.
"""

import sys

from vllm.v1.kv_offload.base import ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

manager = CPUOffloadingManager(
    num_chunks=1, cache_policy="lru", enable_events=True, store_threshold=2, max_tracker_size=1
)
request = ReqContext(req_id="r1")
a = make_offload_key(b"A", 0)

first = manager.prepare_store([a], request)
second = manager.prepare_store([a], request)  # the same request, the same key, again
print(
    f"first offer stores {list(first.keys_to_store)}; the same request's second offer "
    f"stores {list(second.keys_to_store)}; tracker {dict(manager.counts)}"
)
if list(second.keys_to_store):
    print("reproduced: one request took A from count 0 to 2 and A was admitted")
    sys.exit(1)
print("not reproduced: A still needs a second request")
