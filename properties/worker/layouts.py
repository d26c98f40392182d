"""The layouts the worker machine builds a worker for: one to three layers, each a page of some
dtype (optionally split into K and V halves) with padding after it, over a number of GPU blocks,
CPU chunks and blocks per chunk (spec §6). ``worker_layouts()`` draws one; a printed
counterexample names it as ``WorkerLayout(layers=(LayerSpec(...), ...), ...)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from hypothesis import strategies as st

DTYPES = {
    "uint8": torch.uint8,
    "int16": torch.int16,
    "float16": torch.float16,
    "int32": torch.int32,
    "float32": torch.float32,
    "int64": torch.int64,
}


class LayerSpec(NamedTuple):
    """One layer: page size, padding after each page (bytes), dtype, K/V split of the page."""

    page_bytes: int
    pad_bytes: int = 0
    dtype: str = "uint8"
    split: bool = False


class WorkerLayout(NamedTuple):
    layers: tuple[LayerSpec, ...]
    num_gpu_blocks: int
    num_chunks: int
    blocks_per_chunk: int


@st.composite
def layer_specs(draw) -> LayerSpec:
    dtype = draw(st.sampled_from(list(DTYPES)))
    elem = DTYPES[dtype].itemsize
    split = draw(st.booleans())
    elems = draw(st.integers(1, 6)) * (2 if split else 1)
    pad = draw(st.sampled_from([0, 0, 1, 3])) * elem
    return LayerSpec(elems * elem, pad, dtype, split)


def worker_layouts() -> st.SearchStrategy[WorkerLayout]:
    return st.builds(
        WorkerLayout,
        layers=st.lists(layer_specs(), min_size=1, max_size=3).map(tuple),
        num_gpu_blocks=st.one_of(st.integers(1, 10), st.integers(6, 12)),
        num_chunks=st.one_of(st.integers(1, 6), st.integers(3, 8)),
        blocks_per_chunk=st.sampled_from([1, 2, 4, 3]),
    )
