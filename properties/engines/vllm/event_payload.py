"""What the connector's self-describing KV events say about each chunk (spec §7.2).

With ``self_describing_kv_events`` in the connector's extra config, a CPU-tier event of a
full-attention group names every block of each chunk (not only the chunk's last block, which
is its key), and a store event carries the chunk's tokens and the hash of the block before
it. ``Publisher`` stands for the scheduler's KV event publisher: it checks each store event's
payload against the prefix its key names, then hands the checks the events reduced to one
hash per chunk (the key), as the ready-set check reads them:

- **payload exact**: a store event that carries tokens carries the tokens of its chunk (from
  the chunk's first token to its key's end: a partial tail's event stops inside a block), and
  it has a parent block exactly when the chunk is not the request's first.

Its planted fault (a connector whose events describe the wrong tokens) is in faults.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .checks import Checks


class Publisher:
    """Stands for the scheduler's KV event publisher (see the module docstring)."""

    def __init__(
        self,
        checks: Checks,
        *,
        described: Callable[[int], bool],
        blocks_per_chunk: int,
        chunk_tokens: int,
        prefix_of: Callable[[Any, int], tuple[int, ...] | None],
        describe: Callable[[tuple[int, ...]], str],
    ):
        self.checks = checks
        self.described = described  # group -> its events describe every block (self-describing)
        self.bpc = blocks_per_chunk
        self.chunk_tokens = chunk_tokens
        self.prefix_of = prefix_of  # (external hash, group) -> the prefix its chunk ends
        self.describe = describe  # a token prefix, as a failure names it

    def publish(self, batch: Any) -> None:
        events = list(getattr(batch, "events", ()))
        self.checks.published([self._one(e) for e in events])

    def shutdown(self) -> None:
        return None

    def _one(self, event: Any) -> Any:
        if getattr(event, "medium", None) != "CPU":
            return event
        group = int(getattr(event, "group_idx", None) or 0)
        if not self.described(group):
            return event
        hashes = list(getattr(event, "block_hashes", ()))
        # each chunk's last block's hash; a last chunk cut short (a partial tail) ends the event.
        # An event may count its blocks finer than the GPU's (one per block hash, as a partial
        # tail's does beside a recurrent group): its ``block_size`` says how many tokens each has
        size = getattr(event, "block_size", None)
        per = self.chunk_tokens // size if size and self.chunk_tokens % size == 0 else self.bpc
        keys = hashes[per - 1 :: per] + (hashes[-1:] if len(hashes) % per else [])
        if type(event).__name__ == "BlockStored":
            self._payload(event, keys, group)
        return _with_hashes(event, keys)

    def _payload(self, event: Any, keys: list[Any], group: int) -> None:
        tokens = list(getattr(event, "token_ids", None) or ())
        if not tokens or len(keys) != 1:
            return  # a payload left out is not judged (0.33.0 leaves some out)
        prefix = self.prefix_of(keys[0], group)
        if prefix is None:
            return
        self.checks.stats["event payloads"] += 1
        start = (len(prefix) - 1) // self.chunk_tokens * self.chunk_tokens  # the chunk's first
        want = list(prefix[start:])
        first = start == 0
        parent = getattr(event, "parent_block_hash", None)
        if tokens != want or (parent is None) != first:
            said = f"tokens {tokens}" + (", no parent" if parent is None else ", a parent")
            self.checks.fail(
                f"a store event of the CPU tier describes the chunk ending "
                f"{self.describe(prefix)} with {said}; the chunk holds tokens {want}"
                + (" and is the request's first" if first else " after a parent block")
            )


def _with_hashes(event: Any, hashes: list[Any]) -> Any:
    """A copy of the event with other block hashes (vLLM's events are mutable structs)."""
    import copy

    clone = copy.copy(event)
    clone.block_hashes = hashes
    return clone
