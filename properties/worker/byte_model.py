"""The worker machine's byte model: what every byte of a worker's GPU blocks and CPU tier should
hold.

Every GPU block and every CPU sub-block holds a *label*, an int; the bytes of label ``v`` in layer
``l`` are a fixed function of ``(v, l)`` (label 0 is all zeros, what a fresh CPU tier holds), and
the padding after each GPU page holds a fixed pattern of ``(layer, block)`` that nothing may
change. A store copies labels from blocks to sub-blocks, a load from sub-blocks to blocks, a GPU
write gives a block a new label. ``ByteModel(layout, device)`` builds the GPU tensors handed to
the worker (``tensors``: the caller's view of each layer; ``raw``: page and padding as bytes)
and keeps the bytes they and the worker's CPU tier should hold; ``check`` compares all of them
but the destinations of jobs not yet reported, whose copy may or may not have run.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .layouts import DTYPES, WorkerLayout

_ROWS: dict[tuple[int, int, int], torch.Tensor] = {}  # (layer, label, page) -> page bytes


def content(layer: int, label: int, page: int) -> torch.Tensor:
    """The page bytes of ``label`` in ``layer``."""
    row = _ROWS.get((layer, label, page))
    if row is None:
        if label == 0:
            row = torch.zeros(page, dtype=torch.uint8)
        else:
            assert label < 256, "labels must stay below 256 to stay distinct"
            pos = torch.arange(page, dtype=torch.int64)
            row = ((label * 131 + layer * 17 + pos * 29 + 1) % 256).to(torch.uint8)
        _ROWS[(layer, label, page)] = row
    return row


def padding(layer: int, block: int, pad: int) -> torch.Tensor:
    """The bytes after ``block``'s page in ``layer``, which nothing may change."""
    pos = torch.arange(pad, dtype=torch.int64)
    return ((255 - block * 7 - layer * 3 - pos * 5) % 256).to(torch.uint8)


def _describe(row: torch.Tensor) -> str:
    head = row[:8].tolist()
    return f"found bytes starting {head}"


class ByteModel:
    def __init__(self, layout: WorkerLayout, device: torch.device):
        self.layout = layout
        self.n_blocks, self.n_chunks = layout.num_gpu_blocks, layout.num_chunks
        self.bpc = layout.blocks_per_chunk
        self.n_slots = self.n_chunks * self.bpc
        self.gpu_label = list(range(1, self.n_blocks + 1))
        self.slot_label = [0] * self.n_slots
        self.next_label = self.n_blocks + 1
        self.raw: list[torch.Tensor] = []  # uint8 [blocks, page + pad] per layer: page and padding
        self.tensors: list[torch.Tensor] = []  # the caller's view of each layer: the worker's input
        for layer, spec in enumerate(layout.layers):
            width = spec.page_bytes + spec.pad_bytes
            host = torch.stack(
                [
                    torch.cat(
                        [
                            content(layer, self.gpu_label[b], spec.page_bytes),
                            padding(layer, b, spec.pad_bytes),
                        ]
                    )
                    for b in range(self.n_blocks)
                ]
            )
            raw = host.to(device)
            assert raw.shape == (self.n_blocks, width)
            tensor = raw[:, : spec.page_bytes].view(DTYPES[spec.dtype])
            if spec.split:
                tensor = tensor.view(self.n_blocks, 2, -1)
            self.raw.append(raw)
            self.tensors.append(tensor)
        # What every byte should hold now (host tensors, updated with the labels).
        self.expected_gpu = [raw.cpu().clone() for raw in self.raw]
        self.expected_cpu = [
            torch.zeros((self.n_slots, s.page_bytes), dtype=torch.uint8) for s in layout.layers
        ]
        self.bytes_per_block = sum(s.page_bytes for s in layout.layers)

    def set_gpu_label(self, block: int, label: int) -> None:
        self.gpu_label[block] = label
        for layer, spec in enumerate(self.layout.layers):
            self.expected_gpu[layer][block, : spec.page_bytes] = content(
                layer, label, spec.page_bytes
            )

    def set_slot_label(self, slot: int, label: int) -> None:
        self.slot_label[slot] = label
        for layer, spec in enumerate(self.layout.layers):
            self.expected_cpu[layer][slot] = content(layer, label, spec.page_bytes)

    def write_gpu(self, block: int) -> int:
        """Compute writes new data into ``block``: the next label; returns it."""
        label = self.next_label
        self.next_label += 1
        for layer, spec in enumerate(self.layout.layers):
            self.raw[layer][block, : spec.page_bytes].copy_(content(layer, label, spec.page_bytes))
        self.set_gpu_label(block, label)
        return label

    def snapshot(self, cpu_tensors: Iterable[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """Every byte now: the GPU layers (pages and padding) and the worker's CPU tier."""
        out = [(f"gpu layer {i}", raw.cpu().clone()) for i, raw in enumerate(self.raw)]
        out += [(f"cpu layer {i}", t.cpu().clone()) for i, t in enumerate(cpu_tensors)]
        return out

    def check(
        self, cpu_tensors: list[torch.Tensor], blocks_in_flight: set[int], slots_in_flight: set[int]
    ) -> None:
        """Every byte holds what the model says, except GPU blocks and sub-blocks that a job not
        yet reported writes; the CPU tier has the shape spec §6 fixes."""
        for layer, spec in enumerate(self.layout.layers):
            page = spec.page_bytes
            actual, expected = self.raw[layer].cpu(), self.expected_gpu[layer]
            if not torch.equal(actual, expected):
                for b in (actual != expected).any(1).nonzero().flatten().tolist():
                    assert torch.equal(actual[b, page:], expected[b, page:]), (
                        f"layer {layer}: the padding after gpu block {b}'s page changed"
                    )
                    assert b in blocks_in_flight, (
                        f"layer {layer}: gpu block {b} should hold label {self.gpu_label[b]}"
                        f" ({_describe(actual[b, :page])})"
                    )
            cpu = cpu_tensors[layer]
            expected_shape = (self.n_chunks, page * self.bpc)
            assert tuple(cpu.shape) == expected_shape and cpu.dtype == torch.uint8, (
                f"layer {layer}: cpu tensor is {cpu.dtype} {tuple(cpu.shape)}, "
                f"expected uint8 {expected_shape}"
            )
            actual, expected = cpu.cpu().view(self.n_slots, page), self.expected_cpu[layer]
            if not torch.equal(actual, expected):
                for s in (actual != expected).any(1).nonzero().flatten().tolist():
                    assert s in slots_in_flight, (
                        f"layer {layer}: sub-block {s % self.bpc} of chunk {s // self.bpc} "
                        f"should hold label {self.slot_label[s]} ({_describe(actual[s])})"
                    )
