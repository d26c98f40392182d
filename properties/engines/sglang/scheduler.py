"""The scheduler's side of a request's life, as SGLang's scheduler drives its tree cache.

Every call into the cache is SGLang's own function: a request is SGLang's ``Req``; admission
is ``Req.init_next_round_input`` (the prefix match) and ``cache.lock``; a chunk of prefill ends
with ``checkpoint_kv_cache``; finishing and aborting with ``release_kv_cache(checkpoint=True)``;
a retraction with ``release_req`` (which calls ``Req.reset_for_retract``); eviction with the
allocator's ``evict_to_free_tokens``; a reset as ``flush_cache`` does it (cache, request rows and
slots cleared) and only when no request holds KV. Older releases have older calls, each used
where the release has it (never by version): ``cache.inc_lock_ref`` for the lock,
``maybe_cache_unfinished_req`` (``chunked`` for a chunk before the last) for a chunk's end,
``release_kv_cache(is_insert=True)`` at finish, the KV lengths on the request itself (0.5.18).
What the scheduler does besides (slot allocation, writing a request's row, decoding a token) is
done here in a few lines, the way the scheduler does it, because it needs a GPU there.

The scheduler also names what each device slot holds (the page of tokens it was allocated
for), so the copy recorder can say which pages a backup copied, and tells which of the tree's
pages left the GPU (their slots came back to the allocator).
"""

from __future__ import annotations

import inspect
from array import array
from dataclasses import dataclass, field
from typing import Any

import torch

from kvgate.model.radix import Page


def _on_request(req: Any) -> bool:
    """Where the request's KV lengths live: on the request itself and its ``kv`` record made
    at allocation (0.5.18), or on the ``kv`` record it always has (0.5.20 on)."""
    return hasattr(req, "kv_committed_len")


def committed(req: Any) -> int:
    return int(req.kv_committed_len if _on_request(req) else req.kv.kv_committed_len)


def row_of(req: Any) -> int | None:
    return req.req_pool_idx if _on_request(req) else req.kv.req_pool_idx


@dataclass
class Life:
    """One request the scheduler knows: SGLang's ``Req`` and what the harness keeps of it."""

    name: str
    req: Any  # SGLang's Req
    prompt: tuple[int, ...]
    outputs: list[int] = field(default_factory=list)
    admitted: bool = False  # holds a request row (admitted, not retracted or released)
    done: bool = False  # finished or aborted

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.prompt + tuple(self.outputs)

    @property
    def computed(self) -> int:
        return committed(self.req) if self.admitted else 0


class Scheduler:
    """Drives one SGLang tree cache through request lives (see the module docstring)."""

    def __init__(self, release, cache, r2t, allocator, recorder, page_size: int) -> None:
        self.sg = release  # the release's modules and functions (``target.Release``)
        self.cache = cache
        self.r2t = r2t
        self.allocator = allocator
        self.recorder = recorder
        self.page_size = page_size
        self.slot_page: dict[int, Page] = {}  # device slot -> the page it was allocated for
        self.tree_slots: dict[int, Page] = {}  # slots the tree owns (seen in a request's row)
        self.lives: dict[str, Life] = {}

    # --- what slots hold ---
    def page_at(self, tokens: tuple[int, ...], position: int) -> Page:
        end = (position // self.page_size + 1) * self.page_size
        return tuple(tokens[:end])

    def pages_of_slots(self, slots: list[int]) -> list[Page]:
        seen: list[Page] = []
        for slot in slots:
            page = self.slot_page.get(slot)
            if page is not None and page not in seen:
                seen.append(page)
        return seen

    def _free_slots(self) -> set[int]:
        parts = [self.allocator.free_pages]
        if getattr(self.allocator, "release_pages", None) is not None:
            parts.append(self.allocator.release_pages)
        return {int(s) for part in parts for s in torch.as_tensor(part).flatten()}

    def _note_tree_row(self, life: Life, upto: int) -> None:
        """After an insert the request's row holds the tree's slots for ``[0, upto)``."""
        row = self.r2t.req_to_token[row_of(life.req), :upto]
        for position, slot in enumerate(int(s) for s in row):
            self.tree_slots[slot] = self.page_at(life.tokens, position)

    def gone_from_gpu(self) -> list[Page]:
        """Pages whose tree slots came back to the allocator since the last look."""
        free = self._free_slots()
        gone = [s for s in self.tree_slots if s in free]
        pages = []
        for slot in gone:
            page = self.tree_slots.pop(slot)
            if page not in pages:
                pages.append(page)
        still = set(self.tree_slots.values())
        return [p for p in pages if p not in still]

    # --- request lives ---
    def new(self, name: str, prompt: tuple[int, ...], max_new_tokens: int) -> Life:
        req = self.sg.Req(
            name, "", array("q", prompt), self.sg.SamplingParams(max_new_tokens=max_new_tokens)
        )
        life = Life(name, req, tuple(prompt))
        self.lives[name] = life
        return life

    def admit(self, life: Life) -> bool:
        """Match the prefix and take a request row; False when no row or slot is free."""
        req = life.req
        req.init_next_round_input(self.cache)
        if self.r2t.alloc([req]) is None:
            return False
        if hasattr(self.cache, "lock"):  # 0.5.23: a lock object, the path's device slots
            matched = int(req.prefix_len)
            slots = self.cache.path_device_indices(req.last_node)[:matched]
            req.lock = self.cache.lock(req.last_node)
        else:  # 0.5.19-0.5.20: the matched slots, a lock receipt (as ``PrefillAdder``)
            matched = len(req.prefix_indices)
            slots = req.prefix_indices
            locked = self.cache.inc_lock_ref(req.last_node)
            if hasattr(locked, "to_dec_params"):
                req.lock_receipt = locked.to_dec_params()
        if matched:
            self.r2t.write((row_of(req), slice(0, matched)), slots)
        self._computed(req, matched)
        life.admitted = True
        return True

    def _computed(self, req: Any, upto: int) -> None:
        """The request's KV is allocated and committed up to ``upto``, as the scheduler's
        allocation leaves it."""
        if _on_request(req):
            req.kv_committed_len = upto
            if req.kv is None:
                req.kv = self.sg.ReqKvInfo(kv_allocated_len=upto, swa_evicted_seqlen=0)
            req.kv.kv_allocated_len = upto
        else:
            req.kv.kv_allocated_len = req.kv.kv_committed_len = upto

    def _alloc(self, life: Life, start: int, end: int) -> bool:
        n = end - start
        slots = self.allocator.alloc(n)
        if slots is None:
            self.sg.evict_from_tree_cache(self.cache, n)
            slots = self.allocator.alloc(n)
            if slots is None:
                return False
        req = life.req
        self.r2t.write((row_of(req), slice(start, end)), slots)
        tokens = life.tokens
        for offset, slot in enumerate(int(s) for s in torch.as_tensor(slots).flatten()):
            self.slot_page[slot] = self.page_at(tokens, start + offset)
        self._computed(req, end)
        return True

    def prefill_chunk(self, life: Life, end: int) -> bool:
        """Compute the prompt up to ``end`` and checkpoint it into the tree, as a chunk of
        chunked prefill (or the whole prefill) ends."""
        start = life.computed
        if not self._alloc(life, start, end):
            return False
        if self.sg.checkpoint_kv_cache is not None:
            life.req.extend_end = end
            self.sg.checkpoint_kv_cache(life.req, self.cache)
        else:  # a chunk before the last is stashed ``chunked``; the last is cached plainly
            life.req.set_extend_range(start, end)
            chunked = end < len(life.tokens)
            self.sg.maybe_cache_unfinished_req(life.req, self.cache, chunked=chunked)
        self._note_tree_row(life, end - end % self.page_size)
        return True

    def decode(self, life: Life, token: int) -> bool:
        start = life.computed
        life.outputs.append(token)
        life.req.output_ids.append(token)
        if not self._alloc(life, start, start + 1):
            life.outputs.pop()
            life.req.output_ids.pop()
            return False
        return True

    def finish(self, life: Life, abort: bool = False) -> None:
        req = life.req
        if abort:
            req.finished_reason = self.sg.FINISH_ABORT()
        else:
            req.finished_reason = self.sg.FINISH_LENGTH(length=len(life.outputs))
            req.finished_len = len(life.outputs)
        upto = life.computed
        row = row_of(req)
        if self.sg.checkpoint_kv_cache is not None:
            self.sg.release_kv_cache(req, self.cache, checkpoint=True)
        else:
            self.sg.release_kv_cache(req, self.cache, is_insert=True)
        if row is not None:
            kept = self.r2t.req_to_token[row, : upto - upto % self.page_size]
            for position, slot in enumerate(int(s) for s in kept):
                if slot not in self._free_slots():
                    self.tree_slots[slot] = self.page_at(life.tokens, position)
        life.admitted = False
        life.done = True

    def retract(self, life: Life) -> None:
        """SGLang's retraction (decode out of memory): the request gives its KV back and waits
        to be admitted again; what it computed is recomputed then."""
        # 0.5.18 also takes the server arguments
        takes_args = "server_args" in inspect.signature(self.sg.release_req).parameters
        self.sg.release_req(
            req=life.req,
            remaing_req_count=0,
            req_to_token_pool=self.r2t,
            token_to_kv_pool_allocator=self.allocator,
            tree_cache=self.cache,
            hisparse_coordinator=None,
            **({"server_args": self.sg.server_args} if takes_args else {}),
        )
        life.outputs = [int(t) for t in life.req.output_ids]
        life.admitted = False

    def evict(self, tokens: int) -> None:
        self.sg.evict_from_tree_cache(self.cache, self.allocator.available_size() + tokens)

    def idle(self) -> bool:
        return not any(life.admitted for life in self.lives.values())

    def reset(self) -> None:
        """``flush_cache``, which SGLang allows only when the scheduler is idle."""
        self.cache.reset()
        self.r2t.clear()
        self.allocator.clear()
        self.recorder.reset()
        self.tree_slots.clear()
        self.slot_page.clear()

    def writing_check(self) -> None:
        self.cache.writing_check()
