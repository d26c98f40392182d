"""The vLLM scheduler machine's explicit programs (``properties/explicit.py``): paths through the
connector that the drawn examples reach too rarely for ``ci``'s budget, on every layout drawn
for the target. Each names the configuration it goes to; none says what the answer must be
(the machine's checks and oracle judge every step).

- **a proper prefix of a stored prompt**: a prompt of four blocks is computed, stored and
  forgotten by the GPU cache; then a prompt of its first three blocks arrives, then the four
  again with a partial block after them. The first hit ends inside what the CPU tier holds,
  off the chunk boundary a stored request ended on: a sliding window needs the chunks its
  window keeps below that end, which the first request may never have stored.
- **admitted by two requests, loaded within the step**: with a store threshold of 2, two
  requests offer the same prompt (one block; or three, past a window, and the GPU cache forgets
  them), a third arrives while their stores are in flight and is loaded within the step (a
  sync-load budget, where the release has one).
- **a capped load**: the stored prompt again, loading at most one, then two blocks' worth of
  tokens (the connector's ``max_load_tokens``): a cap that ends inside a chunk, and one that
  ends on its boundary, beside every window.
- **a full tier and a small tracker**: a tier of one chunk and a tracker of two keys, three
  requests that share prefixes offered in one step: stores skipped for want of room while the
  tracker drops keys and the requests offer them again (where the skip metric counts a key
  once per request).
"""

from __future__ import annotations

from typing import Any

from ...explicit import Program

Call = tuple[str, dict[str, Any]]
CHECK: Call = ("request_level_checks", {})
DELIVER: Call = ("deliver", dict(mask=15))
EVICT: Call = ("evict_gpu", {})


def _add(blocks: str, tail: int = 0, max_load: Any = None) -> Call:
    return (
        "add_request",
        dict(blocks=blocks, tail=tail, max_tokens=1, max_load=max_load, repeat=0),
    )


def _step(n: int = 3) -> Call:
    return ("step", dict(n=n))


def _setup(
    layout: Any, blocks_per_chunk: int, threshold: int, sync_load: int, async_: bool = False
) -> dict:
    """Room for every chunk, sync or async scheduling (async with KV events on, their payloads
    described: the checks of what the events say run too)."""
    return dict(
        num_chunks=8,
        threshold=threshold,
        tracker=64_000,
        policy="lru",
        async_scheduling=async_,
        gpu_blocks=24,
        blocks_per_chunk=blocks_per_chunk,
        prompt_only=False,
        kv_events=async_,
        layout=layout,
        sync_load=sync_load,
        self_describing=async_,
        retention=0,
    )


def _program(name: str, setup: dict, *calls: Call) -> Program:
    """The set-up, then ``calls``, with the invariant after each, as Hypothesis runs (and
    prints) them."""
    out: list[Call] = [("setup", setup), CHECK]
    for call in calls:
        out += [call, CHECK]
    return Program(name, tuple(out))


# Four blocks computed, stored and forgotten by the GPU cache: where the programs start
STORED: tuple[Call, ...] = (_add("ABCA"), _step(), DELIVER, _step(2), EVICT)
PREFIX = (
    *STORED,
    _add("ABC"),
    _step(),
    DELIVER,
    _step(),
    _add("ABCA", tail=1),
    _step(),
    DELIVER,
    _step(),
)
CAPPED = (
    *STORED,
    _add("ABCA", max_load=2), _step(), DELIVER, _step(), EVICT,
    _add("ABCA", max_load=4), _step(), DELIVER, _step(),
)  # fmt: skip


# Three requests sharing prefixes ('BA', then 'BA' and 'A', then 'A'), offered in one step
CROWDED = (
    _add("BA"),
    ("add_request", dict(blocks="A", tail=0, max_tokens=1, max_load=None, repeat=1)),
    _add("A"),
    _step(2),
)


def programs(layouts: tuple, sync_load: bool) -> list[Program]:
    """Every program on every layout in ``layouts``; ``sync_load``: whether the release's
    connector has a sync-load budget."""
    out = []
    budget = 1 << 30 if sync_load else 0
    for layout in layouts:
        for bpc, async_ in ((1, False), (2, False), (1, True)):
            how = f"{bpc} block(s) a chunk" + (", async" if async_ else "")
            out.append(
                _program(
                    f"a proper prefix of a stored prompt ({layout.name}, {how})",
                    _setup(layout, bpc, 1, 0, async_),
                    *PREFIX,
                )
            )
        for prompt, async_ in (("A", False), ("A", True), ("ABC", False)):
            # the longer prompt meets the CPU tier only once the GPU cache forgot it
            forget = (EVICT,) if len(prompt) > 1 else ()
            how = f"{len(prompt)} block(s)" + (", async" if async_ else "")
            out.append(
                _program(
                    f"admitted by two requests, loaded within the step ({layout.name}, {how})",
                    _setup(layout, 1, 2, budget, async_),
                    *(_add(prompt), _add(prompt), _step(1), *forget, _add(prompt)),
                    *(DELIVER, _step(2), DELIVER, _step()),
                )
            )
        out.append(_program(f"a capped load ({layout.name})", _setup(layout, 2, 1, 0), *CAPPED))
        crowded = {**_setup(layout, 1, 2, 0), "num_chunks": 1, "tracker": 2}
        out.append(_program(f"a full tier and a small tracker ({layout.name})", crowded, *CROWDED))
    return out
