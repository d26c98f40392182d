"""The worker machine's defect builders: transfers and constructions with one thing wrong, and
what the refusal of each must say.

A refusal must *say* what is wrong, each name whole and as written (``job_id``, not
``XXjob_idXX``; ``chunk 2``, not ``chunk 2.5``): the argument and its bad value; for a clash, a
clashing GPU block or sub-block (``gpu block 3``; ``chunk 1`` and ``sub-block 0``) together
with the unreported job it clashes with (``store job 4``); for a wrong chunk count, the
direction. ``refused(what, names)`` checks that; ``invalid_transfer`` and ``construction`` build
the calls from the machine's state (its layout, its unreported jobs, the ids it used).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, NamedTuple

import torch

from kvgate.impl.worker import LOAD, STORE

# Constructor calls (WorkerMachine.construction): the refused ones, then three that must be
# accepted.
CTOR_DEFECTS = (
    "tensor_not_list",
    "not_a_sequence",
    "no_layers",
    "num_chunks_type",
    "num_chunks_negative",
    "bpc_type",
    "bpc_zero",
    "layer_not_tensor",
    "layer_0d",
    "block_count",
    "device",
    "no_blocks",
    "empty_pages",
    "block_not_contiguous",
    "blocks_overlap",
    "not_byte_viewable",
)
CTOR_ACCEPTED = ("zero_chunks", "flat_layer_default_bpc", "one_block_any_stride")
# Transfers (WorkerMachine.invalid_transfer).
DEFECTS = (
    "chunk_count",
    "gpu_block_range",
    "chunk_range",
    "negative_id",
    "repeated_block",
    "repeated_chunk",
    "offset_range",
    "reused_job_id",
    "not_an_int",
    "not_a_sequence",
    "hazard",
)


class Construction(NamedTuple):
    case: str  # the case built (the one asked for, or what it was swapped for)
    args: list[Any]  # the constructor's positional arguments
    tensors: tuple[Any, ...]  # the layers as built (for the accepted cases' checks)
    names: tuple  # what a refusal must say
    layer: int  # the layer the defect is in
    stride: int  # blocks_overlap: the stride between blocks (else 0)


@contextlib.contextmanager
def refused(what: str, names):
    """The block must raise ValueError whose message says every one of ``names``."""
    try:
        yield
    except ValueError as exc:
        missing = [m for m in names if not _names(str(exc), m)]
        assert not missing, f"{what} refused with {str(exc)!r}, which does not name {missing}"
    else:
        raise AssertionError(f"{what} was accepted")


def _says(message: str, words: str) -> bool:
    """``words`` stand in ``message`` whole and as written: not inside a longer name or number
    (``n`` is not said by ``XXnXX``, nor ``chunk 2`` by ``chunk 2.5``)."""
    return re.search(rf"(?<![\w.]){re.escape(words)}(?!\w|\.\d)", message) is not None


def _names(message: str, name) -> bool:
    """A name a refusal must hold: a string, or a tuple of alternatives of which one will do,
    each a string or a tuple of strings that must all be said."""
    if isinstance(name, str):
        return _says(message, name)
    return any(all(_says(message, w) for w in ((a,) if isinstance(a, str) else a)) for a in name)


def clashes(m, kind: str, blocks, chunks, offset: int) -> tuple:
    """How a refusal may name what this transfer clashes on: a clashing sub-block (``chunk
    c``, and ``sub-block j`` where chunks have several) or GPU block (``gpu block b``)
    together with the unreported job it clashes with (``store job 3``); any pair will do."""
    slots = m.slots_of(chunks, offset, len(blocks))
    pairs = []
    for job_id, job in m.pending.items():
        who = f"{job.kind} job {job_id}"
        slot_clash = kind == STORE or job.kind == STORE  # a load may share a load's source
        block_clash = kind == LOAD or job.kind == LOAD  # a store may share a store's source
        if slot_clash:
            for s in slots:
                if s in job.slots:
                    where = (f"chunk {s // m.bpc}",) + (
                        (f"sub-block {s % m.bpc}",) if m.bpc > 1 else ()
                    )
                    pairs.append((*where, who))
        if block_clash:
            pairs += [(f"gpu block {b}", who) for b in blocks if b in job.blocks]
    return tuple(pairs)


def invalid_transfer(m, kind: str, defect: str, picks, chunk_pick: int, offset_pick: int):
    """A transfer that the machine ``m`` would accept now, with one defect: ``(job_id,
    gpu_blocks, chunk_ids, offset, defect, names)``, where ``names`` is what its refusal must
    say. A defect that cannot be made now (no job to clash with, no id used yet) is swapped
    for one that can, and the answer names it."""
    chosen = m.choose(kind, picks, chunk_pick, offset_pick)
    blocks: Any  # Any: the defects below put values of the wrong type in both on purpose
    chunks: Any
    blocks, chunks, offset = chosen if chosen else ([0], [0], 0)
    blocks, chunks = list(blocks), list(chunks)
    if not blocks:
        blocks, chunks = [0], [0]
    job_id = m.next_job
    live = [j for j in m.used_ids if j in m.pending and m.pending[j].blocks]
    if defect == "reused_job_id" and not m.used_ids:
        defect = "offset_range"
    if defect == "hazard" and not live:
        defect = "chunk_count"
    # What the refusal must name (spec §6: "a ValueError naming it").
    names: tuple = ()
    if defect == "chunk_count":
        chunks = (
            chunks[:-1]
            if len(chunks) > 1 or offset_pick % 2
            else chunks + [(chunks[-1] + 1) % m.n_chunks]
        )
        # The count and the direction; where the added id repeats one (a single chunk)
        # the refusal may name the repeat instead.
        names = ("chunk",) if len(set(chunks)) < len(chunks) else ("chunk", kind)
    elif defect == "gpu_block_range":
        blocks[-1] = m.n_blocks + offset_pick // 4  # the first id past the end, or next
        names = ("gpu_blocks", str(blocks[-1]))
    elif defect == "chunk_range":
        chunks[-1] = m.n_chunks + offset_pick // 4
        names = ("chunk_ids", str(chunks[-1]))
    elif defect == "negative_id":
        if offset_pick % 2:
            chunks[-1] = -1
            names = ("chunk_ids", "-1")
        else:
            blocks[-1] = -1
            names = ("gpu_blocks", "-1")
    elif defect == "repeated_block":
        blocks.append(blocks[0])
        names = ("gpu_blocks", str(blocks[0]))
    elif defect == "repeated_chunk":
        chunks.append(chunks[0])
        names = ("chunk_ids", str(chunks[0]))
    elif defect == "offset_range":
        offset = -1 if offset_pick % 2 else m.bpc + offset_pick // 4
        names = ("offset", str(offset))
        # Only the offset is wrong: as many chunk ids as the offset, were it allowed, would
        # need (where there are enough free ones), so no count check can refuse it instead.
        need = -(-(offset + len(blocks)) // m.bpc)
        spare = [c for c in range(m.n_chunks) if c not in chunks]
        if offset > 0 and 0 < need - len(chunks) <= len(spare):
            chunks += spare[: need - len(chunks)]
    elif defect == "reused_job_id":
        job_id = m.used_ids[offset_pick % len(m.used_ids)]
        names = ("job_id", str(job_id))
    elif defect == "not_an_int":
        which = offset_pick % 5
        if which == 0:
            job_id = str(job_id)
            names = ("job_id", repr(job_id))
        elif which == 1:
            blocks[-1] = blocks[-1] + 0.5
            names = ("gpu_blocks", str(blocks[-1]))
        elif which == 2:
            offset = True
            names = ("offset", "True")
        elif which == 3:
            chunks[-1] = None
            names = ("chunk_ids", "None")
        else:
            blocks[0] = str(blocks[0])
            names = ("gpu_blocks", repr(blocks[0]))
    elif defect == "not_a_sequence":  # the whole list replaced by something that is not one
        bad = (len(blocks), None, "".join(map(str, blocks)), float(len(chunks)))[offset_pick % 4]
        if offset_pick // 4:
            chunks, names = bad, ("chunk_ids", repr(bad))
        else:
            blocks, names = bad, ("gpu_blocks", repr(bad))
    elif defect == "hazard":
        other = m.pending[live[(picks or [0])[0] % len(live)]]
        slot, block = other.slots[0], other.blocks[0]
        clash_on_slot = (kind, other.kind) in ((STORE, STORE), (STORE, LOAD), (LOAD, STORE))
        clash_on_block = (kind, other.kind) != (STORE, STORE)
        # For a clash on the GPU block alone, a chunk whose sub-block at this offset is free
        # for this transfer (else the refusal would rightly name the sub-block instead).
        _, _, s_read, s_written = m.touched()
        busy = s_read | s_written if kind == STORE else s_written
        offset %= m.bpc
        free = [c for c in range(m.n_chunks) if c * m.bpc + offset not in busy]
        if clash_on_slot and (offset_pick % 2 or not clash_on_block or not free):
            blocks, chunks, offset = [blocks[0]], [slot // m.bpc], slot % m.bpc
        else:
            blocks, chunks = [block], [free[chunk_pick % len(free)]] if free else [chunks[0]]
        names = (clashes(m, kind, blocks, chunks, offset),)
    return job_id, blocks, chunks, offset, defect, names


def construction(m, case: str, pick: int) -> Construction:
    """The arguments of a second worker built from the machine ``m``'s layout for one
    ``case`` of ``CTOR_DEFECTS`` (to be refused) or ``CTOR_ACCEPTED``; the machine's own tensors
    stay untouched. A case that needs two blocks where there is one is swapped for one that
    does not (the answer names it)."""
    tensors = [t.clone() for t in m.bytes.tensors]  # the machine's own stay untouched
    n, i = m.n_blocks, pick % len(tensors)
    args: list[Any] = [tensors, m.n_chunks, m.bpc]
    names: tuple = ()
    stride = 0
    if case in ("blocks_overlap",) and n < 2:
        case = "empty_pages"
    if case in ("block_count", "device"):
        i = max(1, i)
        if len(tensors) < 2:
            tensors.append(tensors[0].clone())
    layer = f"gpu_tensors[{i}]"
    if case == "tensor_not_list":
        args[0], names = tensors[0], ("gpu_tensors",)
    elif case == "not_a_sequence":
        args[0], names = (t for t in tensors), ("gpu_tensors",)
    elif case == "no_layers":
        args[0], names = [], ("gpu_tensors",)
    elif case == "num_chunks_type":
        args[1] = (str(m.n_chunks), float(m.n_chunks), True)[pick % 3]
        names = ("num_chunks", repr(args[1]))
    elif case == "num_chunks_negative":
        args[1], names = -1 - pick % 3, ("num_chunks", str(-1 - pick % 3))
    elif case == "bpc_type":
        args[2] = (str(m.bpc), float(m.bpc), True)[pick % 3]
        names = ("blocks_per_chunk", repr(args[2]))
    elif case == "bpc_zero":
        args[2], names = -(pick % 2), ("blocks_per_chunk", str(-(pick % 2)))
    elif case == "layer_not_tensor":
        tensors[i], names = tensors[i].tolist(), (layer, "list")
    elif case == "layer_0d":
        tensors[i], names = torch.tensor(7), (layer,)
    elif case == "block_count":
        tensors[i] = tensors[i][:-1] if n > 1 else torch.cat([tensors[i]] * 2)
        names = (layer, str(tensors[i].shape[0]))
    elif case == "device":
        tensors[i], names = torch.empty_like(tensors[i], device="meta"), (layer, "meta")
    elif case == "no_blocks":
        args[0] = [t[:0] for t in tensors]
        names = ("gpu_tensors[0]",)
    elif case == "empty_pages":
        tensors[i], names = tensors[i].new_zeros((n, 0)), (layer,)
    elif case == "block_not_contiguous":
        tensors[i] = tensors[i].new_zeros((n, 3, 2)).transpose(1, 2)
        names = (layer, "contiguous")
    elif case == "blocks_overlap":
        stride = 1 + pick % 2  # below the page of 3 elements
        flat = tensors[i].new_zeros(stride * (n - 1) + 3)
        tensors[i] = flat.as_strided((n, 3), (stride, 1))
        names = (layer, "overlap", f"stride {stride}")
    elif case == "not_byte_viewable":  # a conjugate view cannot be seen as other dtypes
        tensors[i] = tensors[i].new_zeros((n, 2), dtype=torch.complex64).conj()
        names = (layer,)
    elif case == "zero_chunks":
        args[1] = 0
    elif case == "one_block_any_stride":  # one block: its stride is never used
        args[0] = tensors = [t.new_zeros(3).as_strided((1, 3), (1, 1)) for t in tensors]
    elif case == "flat_layer_default_bpc":
        tensors[i] = tensors[i].new_zeros(n)  # one element per block
        args = args[:2]
    return Construction(case, args, tuple(tensors), names, i, stride)
