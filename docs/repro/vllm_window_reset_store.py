"""vLLM 0.33.0 and 0.34.0: after a cache reset that leaves a request running, the connector
stores that request's sliding-window chunks from GPU blocks the window had already freed and
handed out again, so the CPU tier holds other KV under their keys (spec §7.2: a chunk the
manager calls ready holds exactly the KV its key names).

Through vLLM's own Scheduler and OffloadingConnector (kvgate's engine: a worker that moves
bytes, each GPU block's content a hash of its token prefix), with full attention beside a
sliding window of 3 tokens, 2 tokens a block, store_threshold=2, 4 CPU chunks, the manager's
known defect mended (releases/vllm.py's MENDED). r1 (prompt [1,1,1,1,1,1], 3 tokens to
generate) is prefilled; every free GPU block is then taken, so the blocks r1's window frees at
the next step are the only ones the scheduler can hand out. r2 arrives, and the prefix cache is
reset with r1 left running (``reset_prefix_cache(reset_running_requests=False)``). The reset
sends r1's next chunk to store back to chunk 0, while the connector marks freed window blocks
stale only from that index on ("earlier positions were already offloaded"); r1's store of its
first chunks then reads blocks that now hold r2's KV. Exit 1 when the worker reports such a
store.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # releases.vllm_mends

import vllm

from kvgate.properties.engines.vllm import configs, engine
from kvgate.properties.engines.vllm.layouts import Layout
from kvgate.properties.targets import resolve_target
from releases.vllm import MENDED

# the release with its manager's known defect mended, so that only the connector is judged
target = resolve_target(MENDED.get(vllm.__version__, "vllm"))

setup = configs.Setup(
    num_chunks=4,
    store_threshold=2,
    offload_prompt_only=False,
    kv_events=False,
    layout=Layout((None, 3)),  # full attention beside a window of 3 tokens
)
run = engine.VllmEngine(setup, target)
run.add_request("r1", [1, 1] * 3, 3)
run.step()
run.hold_gpu_blocks()  # every free block taken: the window's freed blocks are reused next
run.step()
run.add_request("r2", [1, 1], 1)
run.reset(False)  # the running request r1 is left running
run.step()
run.step()
failure = run.checks.failure
print(failure or "every store read the blocks its chunk names")
sys.exit(1 if failure else 0)
