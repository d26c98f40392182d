"""vLLM 0.33.0 and 0.34.0: beside a sliding window that keeps tokens below itself
(``extra_retained_tokens``), the connector stores a window chunk one of whose blocks is the
null block, and a later request whose hit ends at that chunk loads the unwritten block into the
window it attends to (spec §7.2: a chunk the manager calls ready holds exactly the KV its key
names, and a load never delivers other KV).

Through vLLM's own Scheduler and OffloadingConnector (kvgate's engine: a worker that moves
bytes, each GPU block's content a hash of its token prefix), with full attention beside a
window of 4 tokens keeping 2 below it, 2 tokens a block and 2 blocks a chunk,
store_threshold=2, 3 CPU chunks, synchronous loads, the release as it is (or the target named
as the first argument). r1 sends an 8-token prompt; r2 sends it with 2 more tokens and hits
r1's 8 tokens in the GPU prefix cache, which gives r2's window group only the blocks the window
of token 8 reaches (tokens 5 to 8, and the 2 kept below: from token 3), so the null block
stands in place of its first block. r2's offer admits its chunks, and the connector stores the
window group's first chunk: the store mask, widened by the 2 kept tokens, names the chunk's
second block, and the null first block is left unwritten. r3 sends the first 6 tokens; its hit
ends at token 4, whose window (tokens 1 to 4) needs the first block, and the connector loads
the whole chunk into r3's window. Exit 1 when the worker reports that load.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvgate.properties.engines.vllm import configs, engine
from kvgate.properties.engines.vllm.layouts import Layout
from kvgate.properties.targets import resolve_target

TARGET = sys.argv[1] if len(sys.argv) > 1 else "vllm"  # the release as it is, or a mended one

setup = configs.Setup(
    num_chunks=3,
    store_threshold=2,
    offload_prompt_only=False,
    blocks_per_chunk=2,
    kv_events=False,
    layout=Layout((None, 4), extra=2),  # full attention beside a window of 4 keeping 2
    sync_load_budget=1 << 30,
)
run = engine.VllmEngine(setup, resolve_target(TARGET))
prompt = [3, 3, 3, 3, 1, 1, 1, 1]
run.add_request("r1", prompt, 1)
run.step()
run.add_request("r2", prompt + [1, 1], 1)
run.step()
run.worker.finish(run.worker.jobs())
run.step()
run.add_request("r3", prompt[:6], 1)
run.step()
failure = run.checks.failure
print(failure or "every load delivered the KV its chunks name")
sys.exit(1 if failure else 0)
