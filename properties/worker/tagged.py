"""The GPU-copy worker (impl/worker.py) with data tags, for end-to-end checks of the driver.

``TaggedCopyWorker`` owns small KV tensors (``layers`` tensors of ``[num_gpu_blocks,
page_bytes]``; on ``device``), hands every call of the worker interface to an ``OffloadWorker``
over them, and adds what the data checks need: ``write_gpu(block, tag)`` (the scheduler driver
calls it when compute writes a block) fills a block's page in every layer with a pattern made of
the tag (a block hash) and the layer number, ``gpu_tag(block)`` and ``chunk_tags(chunk)``
(``properties.audit`` reads them) read the pattern back (``None`` for a zero page,
``"garbage:..."`` for anything else). So a replay or a test moves real bytes and
checks that every chunk holds its key's blocks and every load brings them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

TAG_BYTES = 8


class TaggedCopyWorker:
    def __init__(
        self,
        num_gpu_blocks: int,
        num_chunks: int,
        blocks_per_chunk: int = 1,
        *,
        page_bytes: int = 32,
        layers: int = 2,
        device: str = "cpu",
        worker_cls: type | None = None,
    ):
        import torch

        from kvgate.impl.worker import OffloadWorker

        worker_cls = worker_cls or OffloadWorker
        if page_bytes < TAG_BYTES + 1:
            raise ValueError(f"page_bytes must be >= {TAG_BYTES + 1}, got {page_bytes}")
        self.torch = torch
        self.page_bytes = page_bytes
        self.blocks_per_chunk = blocks_per_chunk
        self.layers = layers
        self.gpu = [
            torch.zeros(num_gpu_blocks, page_bytes, dtype=torch.uint8, device=device)
            for _ in range(layers)
        ]
        self.worker = worker_cls(self.gpu, num_chunks, blocks_per_chunk)

    # --- the worker interface
    def submit_store(
        self, job_id: int, gpu_blocks: Sequence[int], chunk_ids: Sequence[int], offset: int = 0
    ) -> None:
        self.worker.submit_store(job_id, list(gpu_blocks), list(chunk_ids), offset)

    def submit_load(
        self, job_id: int, chunk_ids: Sequence[int], gpu_blocks: Sequence[int], offset: int = 0
    ) -> None:
        self.worker.submit_load(job_id, list(chunk_ids), list(gpu_blocks), offset)

    def get_finished(self) -> list[Any]:
        return self.worker.get_finished()

    def wait(self, job_ids: Iterable[int]) -> None:
        self.worker.wait(list(job_ids))

    def fail_next(self, n: int = 1, kind: str | None = None) -> None:
        self.worker.fail_next(n, kind)

    # --- data tags
    def _pattern(self, tag: bytes, layer: int) -> bytes:
        unit = bytes(tag) + bytes([layer + 1])
        return (unit * (self.page_bytes // len(unit) + 1))[: self.page_bytes]

    def _decode(self, pages: list[bytes]) -> Any:
        if all(not any(p) for p in pages):
            return None
        tag = pages[0][:TAG_BYTES]
        if all(p == self._pattern(tag, layer) for layer, p in enumerate(pages)):
            return tag
        return "garbage:" + pages[0][: TAG_BYTES + 1].hex()

    def write_gpu(self, block: int, tag: Any) -> None:
        torch = self.torch
        for layer, t in enumerate(self.gpu):
            data = torch.frombuffer(bytearray(self._pattern(tag, layer)), dtype=torch.uint8)
            t[block].copy_(data)

    def gpu_tag(self, block: int) -> Any:
        return self._decode([bytes(t[block].cpu().numpy().tobytes()) for t in self.gpu])

    def chunk_tags(self, chunk: int) -> list:
        rows = [bytes(c[chunk].cpu().numpy().tobytes()) for c in self.worker.cpu_tensors]
        page = self.page_bytes
        return [
            self._decode([row[j * page : (j + 1) * page] for row in rows])
            for j in range(self.blocks_per_chunk)
        ]
