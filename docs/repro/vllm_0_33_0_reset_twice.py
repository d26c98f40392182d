"""vLLM 0.33.0: a second cache reset before the engine has stepped again raises, when a
transfer was in flight at the first (``reset_cache`` asserts ``not
self._current_batch_jobs_to_flush``; the first reset left the flushed jobs there for the next
step's metadata to carry). The client's second ``reset_prefix_cache`` gets an AssertionError
from the engine, and the connector's cache is not reset. 0.34.0 merges the second reset's
flush set into the pending one.

Through vLLM's own Scheduler and OffloadingConnector (kvgate's engine; one full-attention
group, 2 tokens a block, store_threshold=1, 2 CPU chunks, the release's own manager): r1
(prompt [1, 1, 2, 2]) is scheduled once, so its store job is issued and still in flight (the
worker has not reported it); then the prefix cache is reset twice with ``reset_connector``, as
two clients' calls arriving between two steps would. Exit 1 when the second reset raises.
"""

import sys

from kvgate.properties.engines.vllm import configs, engine

setup = configs.Setup(num_chunks=2, store_threshold=1, offload_prompt_only=False, kv_events=False)
run = engine.VllmEngine(setup)
run.add_request("r1", [1, 1, 2, 2], 2)
run.step()  # r1's prefill: its chunks' store job is issued, not yet reported done
print("jobs in flight:", sorted(run.worker.in_flight))
run.reset()
try:
    run.reset()
except AssertionError as exc:
    print(f"the second reset raised AssertionError {exc}".rstrip())
    sys.exit(1)
print("both resets ran")
sys.exit(0)
