"""Request traces in the Mooncake JSONL format, and their requests for the scheduler driver.

One JSON object per line: ``timestamp`` (ms), ``input_length`` and ``output_length`` (tokens),
``hash_ids`` (remapped prefix block hashes, one per block of ``TRACE_BLOCK_SIZE`` tokens; the last
block may be partial). Equal ids mean the same prefix block, so the ids are already chained:
each one becomes a block hash as it is (``hash_id_to_block_hash``). Only complete blocks are
offered, as an engine hashes only complete blocks.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .scheduler import Request, hash_id_to_block_hash

TRACE_BLOCK_SIZE = 512


class TraceError(ValueError):
    """A trace line that is not a request; names the file and line."""


@dataclass(frozen=True)
class TraceRequest:
    timestamp: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_request(self, req_id: str, block_size: int = TRACE_BLOCK_SIZE) -> Request:
        """The driver's request: complete prompt blocks only, at least one output token."""
        full = min(len(self.hash_ids), self.input_length // block_size)
        hashes = [hash_id_to_block_hash(h) for h in self.hash_ids[:full]]
        return Request(
            req_id, hashes, max(1, self.input_length), max_output_tokens=max(1, self.output_length)
        )


def _parse(line: str, where: str) -> TraceRequest:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected an object, got {type(obj).__name__}")
    try:
        ts, inp, out, ids = (
            obj["timestamp"],
            obj["input_length"],
            obj["output_length"],
            obj["hash_ids"],
        )
    except KeyError as e:
        raise TraceError(f"{where}: missing field {e.args[0]!r}") from None
    for name, value in (("timestamp", ts), ("input_length", inp), ("output_length", out)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TraceError(f"{where}: {name} must be an int >= 0, got {value!r}")
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids
    ):
        raise TraceError(f"{where}: hash_ids must be a list of ints >= 0")
    return TraceRequest(ts, inp, out, tuple(ids))


def iter_trace(path: str | Path, limit: int | None = None) -> Iterator[TraceRequest]:
    """The trace's requests in file order (blank lines skipped), at most ``limit``."""
    path = Path(path)
    n = 0
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if limit is not None and n >= limit:
                return
            if not line.strip():
                continue
            yield _parse(line, f"{path}:{lineno}")
            n += 1


def load_trace(path: str | Path, limit: int | None = None) -> list[TraceRequest]:
    return list(iter_trace(path, limit))
