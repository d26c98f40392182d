"""vLLM 0.33.0 and 0.34.0: beside a recurrent (Mamba, ``align`` mode) group, a speculative
drafter's (EAGLE) group offers one key twice in one step: the partial tail's store job keys the
drafter's group at the boundary plus the drafter's proof margin, which can be the end of a
whole chunk that the step's whole-chunk store job names too, so the connector calls
``prepare_store`` with that key twice for one request (spec §7.2: each chunk a
request offers is offered once, again only as a retry after ``None``, after a preemption or
after a reset). A manager that counts every offer, as 0.33.0's does, counts that request twice.

Through vLLM's own Scheduler and OffloadingConnector, as kvgate's vLLM scheduler machine drives
them (its request-level checks only, no lockstep oracle, so 0.33.0's counting is not judged
first): a drafter's group beside a recurrent group, one block a chunk, store_threshold=2, 4 CPU
chunks, the release as it is (or the target named as the first argument). Five requests share
a prompt of repeated blocks; the fifth extends the fourth's prompt, and in the step that
computes its last block the partial tail's job and the whole-chunk job both name the drafter's
chunk AAAAAA. Exit 1 when the second
offer is seen.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvgate.properties.engines.vllm import machine
from kvgate.properties.engines.vllm.layouts import Layout
from kvgate.properties.targets import resolve_target

TARGET = sys.argv[1] if len(sys.argv) > 1 else "vllm"  # the release as it is, or a mended one

state = machine.make_machine(resolve_target(TARGET), lockstep=False)()
setup = dict(threshold=2, tracker=64000, policy="lru", async_scheduling=False, gpu_blocks=16)
state.setup(
    num_chunks=4,
    blocks_per_chunk=1,
    prompt_only=False,
    kv_events=False,
    layout=Layout((None, None), eagle=0, recurrent=1),  # a drafter beside a recurrent group
    sync_load=0,
    self_describing=False,
    retention=0,
    **setup,
)
program = [
    ("add_request", dict(blocks="AAA", max_tokens=2, repeat=0, tail=1)),
    ("add_request", dict(blocks="A", max_tokens=3, repeat=0, tail=1)),
    ("step", dict(n=1)),
    ("step", dict(n=1)),
    ("step", dict(n=2)),
    ("add_request", dict(blocks="AAA", max_tokens=4, repeat=2, tail=1)),
    *[("step", dict(n=1))] * 4,
    ("add_request", dict(blocks="A", max_tokens=1, repeat=1, tail=1)),
    ("step", dict(n=3)),
    ("deliver", dict(mask=1)),
    ("step", dict(n=1)),
    ("add_request", dict(blocks="A", max_tokens=1, repeat=1, tail=0)),
    ("step", dict(n=1)),
    ("deliver", dict(mask=1)),
    *[("step", dict(n=1))] * 4,
]
try:
    for rule, args in program:
        getattr(state, rule)(**args)
        state.request_level_checks()
    state.teardown()
except AssertionError as exc:
    print(str(exc).splitlines()[0])
    sys.exit(1 if "again" in str(exc) else 2)
print("every chunk was offered once")
