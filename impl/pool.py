"""The CPU tier's chunk ids: never-used ids in increasing order first, then freed ids,
last freed first (spec §4)."""

from __future__ import annotations


class ChunkPool:
    def __init__(self, num_chunks: int):
        self.num_chunks = num_chunks
        self._next_fresh = 0
        self._freed: list[int] = []

    @property
    def free_count(self) -> int:
        return self.num_chunks - self._next_fresh + len(self._freed)

    def allocate(self, n: int) -> list[int]:
        if n > self.free_count:
            raise RuntimeError(f"asked for {n} chunks, {self.free_count} free")
        fresh = min(n, self.num_chunks - self._next_fresh)
        ids = list(range(self._next_fresh, self._next_fresh + fresh))
        self._next_fresh += fresh
        for _ in range(n - fresh):
            ids.append(self._freed.pop())
        return ids

    def release(self, chunk_id: int) -> None:
        self._freed.append(chunk_id)

    def reset(self) -> None:
        self._next_fresh = 0
        self._freed.clear()
