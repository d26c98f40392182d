"""vLLM 0.33.0 and 0.34.0: a request admitted with a connector hit beside a recurrent (Mamba,
``align`` mode) group is counted one block short, so the scheduler raises on the pool's last
block instead of leaving the request waiting (``KVCacheManager.allocate_slots`` promises
``None`` when the free blocks do not cover a request; its raise ends the engine).

Through vLLM's own Scheduler and OffloadingConnector (kvgate's engine), with full attention
beside a recurrent group, 4 tokens a block (2 a block hash), a GPU pool of 5 blocks (4 free
beside the null block), store_threshold=1, synchronous loads, the release as it is (or the
target named as the first argument). r1 sends a 9-token prompt and is prefilled 8 tokens (two
full-attention blocks, one state block); its chunks are stored. Its next step needs a third
full-attention block and a second state block, the pool has one: r1 is preempted. Other traffic
takes and gives back the free blocks, so the GPU prefix cache forgets r1's blocks. r1 is
scheduled again and hits its 8 tokens in the CPU tier: the recurrent group's count
(``MambaManager.get_num_blocks_to_allocate``) reserves one block, but the group takes one for
the loaded state and one for the running state; with 4 free blocks counted as enough for 4, the
fifth raises "Cannot get 1 free blocks from the pool". Exit 1 when the step raises.
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
    store_threshold=1,
    offload_prompt_only=False,
    gpu_blocks=10,  # halved for the recurrent layout's blocks of twice the tokens: 5
    kv_events=False,
    layout=Layout((None, None), recurrent=1),  # full attention beside a recurrent group
    sync_load_budget=1 << 30,
)
run = engine.VllmEngine(setup, resolve_target(TARGET))
run.add_request("r1", [3] * 8 + [1], 1)
try:
    run.step()  # r1 prefilled 8 tokens; its chunks stored
    run.step()  # r1 needs two blocks more, the pool has one: preempted
    run.release_gpu_blocks(run.hold_gpu_blocks())  # the GPU prefix cache forgets r1
    run.step()  # r1 hits its 8 tokens in the CPU tier
except ValueError as exc:
    print(f"the scheduler raised: {exc}")
    sys.exit(1)
print("the scheduler left r1 waiting for blocks")
