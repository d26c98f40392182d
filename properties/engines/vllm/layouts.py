"""The KV-cache layouts vLLM's scheduler machine builds, and what each promises (spec §7.2).

A ``Layout`` lists the model's KV-cache groups in order: ``None`` is a full-attention group,
an integer ``W`` a sliding-window group whose tokens attend to the ``W`` tokens ending at
themselves (``extra`` more tokens below the window are kept but never attended). All groups
share one GPU block pool and one block size; every group's chunk covers the same tokens, and
its key is the block hash of the chunk's last block with the group's index appended.

What a layout means, as the checks read it:

- **computes with**: a position of a full-attention group attends to every earlier position; a
  position ``p`` of a sliding-window group to ``[p - W + 1, p]`` only (the blocks wholly below
  the window may be freed: the scheduler puts the null block in their place);
- **servable hit**: a hit ending at token ``E`` can be served when every full-attention group
  has ready chunks from the chunk of the first token not computed on the GPU up to the chunk
  holding ``E - 1``, and every sliding-window group has ready the chunks that hold the tokens
  its window keeps before ``E`` (``E - W + 1 - extra`` on), and never fewer than the ``W``
  tokens' worth of chunks the connector documents as the window (``cdiv(W, chunk tokens)``,
  one chunk more than the window keeps when ``W - 1`` is a multiple of a chunk: a smaller hit,
  never wrong KV); chunks below the first one not computed on the GPU are not needed (the GPU
  holds them). A layout with a sliding-window group never hits the request's last token (it is
  recomputed, with its window, to sample from). A speculative drafter's group (EAGLE, keyed by
  the block hashes without lookahead) proves a hit by the chunk after it: it needs ready chunks
  through the chunk past the one holding ``E - 1``, which the request must have keyed (the
  drafter's KV of a hit's last position is recomputed, as vLLM's prefix cache drops a drafter's
  last matched block).

A **recurrent** group (a Mamba layer in vLLM's ``align`` mode) holds no KV per token but one
state per block: the state after the block's last computed token. Its block spans two block
hashes, so a prefix may end inside a block: the scheduler copies the state at such a boundary
into a block of its own (copy-on-write) and hands it to the connector, which stores it with the
full-attention group's partly filled block (a partial tail). A hit ending at token ``E`` needs
the recurrent state after exactly ``E`` tokens ready, and every full-attention chunk from the
first not computed on the GPU, the last one either whole or cut at ``E``.

``available()`` lists the layouts the installed release's connector has, found by capability.
A drafter's group comes without a speculative config, so its keys are the block hashes
(``num_hash_lookahead_tokens`` is 0): the connector's legacy EAGLE handling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FULL: tuple[int | None, ...] = (None,)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Layout:
    """KV-cache groups in order: ``None`` full attention, ``W`` a sliding window of ``W``
    tokens; ``extra``: tokens kept below every window (``extra_retained_tokens``)."""

    windows: tuple[int | None, ...] = FULL
    extra: int = 0
    eagle: int | None = None  # the group that holds a speculative drafter's (EAGLE) layers
    recurrent: int | None = None  # the group of recurrent (Mamba, align mode) layers

    def __repr__(self) -> str:
        extra = f", extra={self.extra}" if self.extra else ""
        eagle = f", eagle={self.eagle}" if self.eagle is not None else ""
        mamba = f", recurrent={self.recurrent}" if self.recurrent is not None else ""
        return f"Layout(windows={self.windows!r}{extra}{eagle}{mamba})"

    @property
    def name(self) -> str:
        parts = [
            ("mamba" if g == self.recurrent else "full" if w is None else f"swa{w}")
            + ("(eagle)" if g == self.eagle else "")
            for g, w in enumerate(self.windows)
        ]
        return "+".join(parts) + (f"(+{self.extra})" if self.extra else "")

    @property
    def checked_offers(self) -> int | None:
        """The group whose every chunk a finished request must have offered (one target
        full-attention group), or ``None``. With a recurrent group none: a full-attention
        chunk serves a hit only with a recurrent state at or after it, and which states are
        stored follows which boundaries the scheduler hands off (the connector's policy)."""
        if self.recurrent is not None:
            return None
        full = [
            g
            for g, w in enumerate(self.windows)
            if w is None and g not in (self.eagle, self.recurrent)
        ]
        return full[0] if len(full) == 1 else None

    @property
    def sliding(self) -> bool:
        return any(w is not None for w in self.windows)

    def attended_from(self, group: int, position: int) -> int:
        """The first position a token at ``position`` of ``group`` attends to."""
        window = self.windows[group]
        return 0 if window is None else max(0, position - window + 1)

    def window_chunks(self, group: int, end: int, chunk_tokens: int) -> int | None:
        """Chunks of ``group`` a hit ending at token ``end`` needs ready below ``end``
        (counted back from the chunk holding ``end - 1``); ``None``: all of them."""
        window = self.windows[group]
        if window is None:
            return None
        kept = window - 1 + self.extra + (-end % chunk_tokens)
        return max(cdiv(window, chunk_tokens), cdiv(kept, chunk_tokens))

    def servable(self, end: int, start_chunk: int, chunk_tokens: int, keyed: int, ready) -> bool:
        """Whether a hit ending at token ``end`` can be served: ``ready(group, chunk)``;
        ``keyed``: the request's chunks with a key."""
        last = cdiv(end, chunk_tokens)
        for group in range(len(self.windows)):
            need = self.window_chunks(group, end, chunk_tokens)
            first = start_chunk if need is None else max(start_chunk, last - need)
            upto = last
            if group == self.eagle:  # the drafter's chunk past the hit proves it (dropped)
                upto += 1
                if upto > keyed:
                    return False
            if not all(ready(group, c) for c in range(first, upto)):
                return False
        return True

    def serves_partial(
        self, end: int, start_chunk: int, chunk_tokens: int, hash_tokens: int, ready
    ):
        """With a recurrent group, whether a hit ending at token ``end`` (a multiple of
        ``hash_tokens``) can be served: ``ready(group, hash_index)`` for the key of the block
        hash that ends at token ``(hash_index + 1) * hash_tokens``."""
        last = end // hash_tokens - 1
        for group in range(len(self.windows)):
            if group == self.recurrent:
                if not ready(group, last):
                    return False
                continue
            for chunk in range(start_chunk, cdiv(end, chunk_tokens)):
                whole = (chunk + 1) * chunk_tokens // hash_tokens - 1
                # a chunk wholly below the hit, or the last one: whole, or cut at the hit
                cuts = range(last, whole + 1) if whole > last else (whole,)
                if not any(ready(group, h) for h in cuts):
                    return False
        return True

    def kv_cache_config(self, gpu_blocks: int, block_size: int) -> Any:
        import torch
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )

        groups = []
        for i, window in enumerate(self.windows):
            common: dict[str, Any] = dict(
                block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
            )
            if i == self.recurrent:
                spec: Any = MambaSpec(
                    block_size=block_size,
                    shapes=((1, 1),),
                    dtypes=(torch.float32,),
                    mamba_cache_mode="align",
                )
            elif window is None:
                spec = FullAttentionSpec(**common)
            else:
                if self.extra:
                    common["extra_retained_tokens"] = self.extra
                spec = SlidingWindowSpec(sliding_window=window, **common)
            drafter: dict[str, Any] = {"is_eagle_group": True} if i == self.eagle else {}
            groups.append(KVCacheGroupSpec([f"layer.{i}"], spec, **drafter))
        return KVCacheConfig(num_blocks=gpu_blocks, kv_cache_tensors=[], kv_cache_groups=groups)

    def chunks_per_request(self, max_model_len: int, chunk_tokens: int) -> int:
        """The chunks one request of ``max_model_len`` tokens keeps in the tier (what the
        tier's published size in tokens is counted by)."""
        total = 0
        for group in range(len(self.windows)):
            if group == self.recurrent:  # one state stands for the whole prefix
                total += 1
                continue
            whole = cdiv(max_model_len, chunk_tokens)
            window = self.window_chunks(group, 0, chunk_tokens)
            total += whole if window is None else min(whole, window)
        return total


FULL_ATTENTION = Layout()  # one full-attention group: the layout every release has
# Layouts on which both releases have a known connector defect (docs/upstream.md): the window
# of 4 keeping 2 (a chunk stored with its first block unwritten), a drafter beside a recurrent
# group (a key offered twice in a step). Drawn only for a target that carries the mends.
NEEDS_MENDS = frozenset({Layout((None, 4), extra=2), Layout((None, None), eagle=0, recurrent=1)})


def offload_key(block_hash: Any, group: int) -> bytes:
    """A chunk's key: its last block's hash, then the group's index (4 bytes, big-endian)."""
    return bytes(block_hash) + group.to_bytes(4, "big")


def key_group(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big")


def available() -> tuple[Layout, ...]:
    """The layouts the installed release supports, by capability: sliding-window groups where
    the connector sizes a group's window (``GroupOffloadConfig.sliding_window_size_in_chunks``),
    kept tokens below the window where ``SlidingWindowSpec`` has ``extra_retained_tokens``."""
    import dataclasses

    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler
    from vllm.v1 import kv_cache_interface

    layouts = [Layout()]
    group = getattr(scheduler, "GroupOffloadConfig", None)
    spec = getattr(kv_cache_interface, "SlidingWindowSpec", None)
    if (
        group is not None
        and spec is not None
        and "sliding_window_size_in_chunks" in getattr(group, "_fields", ())
    ):
        layouts += [Layout((None, 3)), Layout((None, 4)), Layout((None, 5))]
        fields = {f.name for f in dataclasses.fields(spec)}
        if "extra_retained_tokens" in fields:
            layouts += [Layout((None, 3), extra=2), Layout((None, 4), extra=2)]
    if "supports_partial_tail" in getattr(
        getattr(scheduler, "SchedulerOffloadConfig", None), "_fields", ()
    ) and hasattr(scheduler, "resolve_mamba_align_size"):
        layouts.append(Layout((None, None), recurrent=1))
    groups = {f.name for f in dataclasses.fields(kv_cache_interface.KVCacheGroupSpec)}
    if "is_eagle_group" in groups and "is_eagle_group" in getattr(group, "_fields", ()):
        layouts.append(Layout((None, None), eagle=1))
        if any(layout.recurrent is not None for layout in layouts):
            # a drafter beside a recurrent group: the drafter's partial tails
            layouts.append(Layout((None, None), eagle=0, recurrent=1))
    return tuple(layouts)


def sync_loads() -> bool:
    """Whether the connector loads within a step up to a byte budget
    (``sync_load_budget_bytes`` in its extra config)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler

    config = getattr(scheduler, "SchedulerOffloadConfig", None)
    return "sync_load_budget_bytes" in getattr(config, "_fields", ())


def offload_caps() -> bool:
    """Whether the connector reads a request's ``max_offload_tokens`` (its cap on the tokens
    it offloads, from ``kv_transfer_params``)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler

    state = getattr(scheduler, "RequestOffloadState", None)
    return "max_offload_tokens" in getattr(state, "__annotations__", {})


def streaming_sessions() -> bool:
    """Whether the release runs streaming-input sessions (a resumable request whose later
    inputs, sent under its id, extend its prompt)."""
    import inspect

    from vllm.v1.request import Request, RequestStatus

    return "resumable" in inspect.signature(Request).parameters and hasattr(
        RequestStatus, "WAITING_FOR_STREAMING_REQ"
    )
