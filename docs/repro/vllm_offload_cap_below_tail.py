"""vLLM 0.33.0 and 0.34.0: a request whose ``max_offload_tokens`` ends before the boundary its
recurrent (Mamba) group's state is handed off at raises an ``AssertionError`` in the
scheduler's connector (``assert boundary <= max_boundary``), which ends the engine. The cap is
a valid request parameter (a non-negative int in ``kv_transfer_params``); the full-attention
stores honour it, the partial-tail store path does not.

Through vLLM's own Scheduler and OffloadingConnector (kvgate's engine), with full attention
beside a recurrent group, one block a chunk, store_threshold=2, the release as it is (or the
target named as the first argument). r1 sends 6 tokens and runs a step. r2 sends the same 6
tokens and 2 more, with ``max_offload_tokens`` 3: the GPU prefix cache hands r2's recurrent
state off at r1's 6 tokens, a boundary past r2's cap, and the connector's next step asserts
that no boundary lies past the cap instead of leaving that tail unstored. Exit 1 when a step
raises.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvgate.properties.engines.vllm import configs, engine
from kvgate.properties.engines.vllm.layouts import Layout
from kvgate.properties.targets import resolve_target

TARGET = sys.argv[1] if len(sys.argv) > 1 else "vllm"  # the release as it is, or a mended one

setup = configs.Setup(
    num_chunks=1,
    store_threshold=2,
    offload_prompt_only=False,
    kv_events=False,
    layout=Layout((None, None), recurrent=1),  # full attention beside a recurrent group
)
run = engine.VllmEngine(setup, resolve_target(TARGET))
run.add_request("r1", [2, 2, 1, 1, 1, 1], 1)
try:
    run.step()
    run.add_request("r2", [2, 2, 1, 1, 1, 1, 1, 1], 1, max_offload=3)
    run.step()
    run.step()
except AssertionError as exc:
    where = exc.__traceback__
    while where.tb_next is not None:
        where = where.tb_next
    print(
        f"the scheduler raised AssertionError at line {where.tb_lineno} of "
        f"{Path(where.tb_frame.f_code.co_filename).name}"
    )
    sys.exit(1)
print("r2 ran with its cap, its tail past the cap left unstored")
