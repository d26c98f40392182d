"""The scheduler's side of a request's life, as SGLang's scheduler drives its tree cache.

Every call into the cache is SGLang's own function: a request is SGLang's ``Req``; admission
is ``Req.init_next_round_input`` (the prefix match) and ``cache.lock``; a chunk of prefill ends
with ``checkpoint_kv_cache``; finishing and aborting with ``release_kv_cache(checkpoint=True)``;
a retraction with ``release_req`` (which calls ``Req.reset_for_retract``); eviction with the
allocator's ``evict_to_free_tokens``; a reset as ``flush_cache`` does it (cache, request rows and
slots cleared) and only when no request holds KV. Older releases have older calls, each used
where the release has it (never by version): ``cache.inc_lock_ref`` for the lock,
``maybe_cache_unfinished_req`` (``chunked`` for a chunk before the last) for a chunk's end,
``release_kv_cache(is_insert=True)`` at finish, the KV lengths on the request itself (0.5.18);
in 0.4.x the cache's own ``cache_unfinished_req`` and ``cache_finished_req``, ``cache.evict`` as
``ScheduleBatch._evict_tree_cache_if_needed`` calls it, a retraction by SGLang's
``ScheduleBatch.retract_decode`` (retraction is inline there) on a batch that holds the request,
and the KV lengths kept here, as 0.4.x's batch keeps them (``seq_lens``) and not its request.
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
from types import SimpleNamespace
from typing import Any

import torch

from kvgate.model.radix import Page

OUTPUT_AT_FINISH = 399  # the token a 0.4.x request finishes on (its KV never computed)


def _on_request(req: Any) -> bool:
    """Where the request's KV lengths live: on the request itself and its ``kv`` record made
    at allocation (0.5.18), or on the ``kv`` record it always has (0.5.20 on); a request with
    neither (0.4.x) has them kept by the harness as ``kvgate_committed``."""
    return hasattr(req, "kv_committed_len") or not hasattr(req, "kv")


def committed(req: Any) -> int:
    if not hasattr(req, "kv"):
        return int(getattr(req, "kvgate_committed", 0))
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
    retractions: int = 0  # how often it was retracted (the next admission resumes it)

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
        # the prompt as the release's Req takes it: an array (0.5.x) or a list (0.4.x)
        takes = inspect.signature(self.sg.Req).parameters["origin_input_ids"].annotation
        ids = array("q", prompt) if "array" in str(takes) else list(prompt)
        req = self.sg.Req(name, "", ids, self.sg.SamplingParams(max_new_tokens=max_new_tokens))
        life = Life(name, req, tuple(prompt))
        self.lives[name] = life
        return life

    def admit(self, life: Life) -> bool:
        """Match the prefix and take a request row; False when no row or slot is free."""
        req = life.req
        req.init_next_round_input(self.cache)
        if "need_size" in inspect.signature(self.r2t.alloc).parameters:  # 0.4.x: row numbers
            rows = self.r2t.alloc(1)
            if rows is None:
                return False
            req.req_pool_idx = rows[0]
        elif self.r2t.alloc([req]) is None:
            return False
        if hasattr(self.cache, "lock"):  # 0.5.23: a lock object, the path's device slots
            matched = int(req.prefix_len)
            slots = self.cache.path_device_indices(req.last_node)[:matched]
            req.lock = self.cache.lock(req.last_node)
        else:  # 0.5.19-0.5.20: the matched slots, a lock receipt (as ``PrefillAdder``)
            matched = len(req.prefix_indices)
            slots = req.prefix_indices
            locked = self.cache.inc_lock_ref(req.last_node)  # 0.4.x: no receipt
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
        if not hasattr(req, "kv"):
            req.kvgate_committed = upto
        elif _on_request(req):
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
            self._evict_to(n)
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
        elif self.sg.maybe_cache_unfinished_req is None:  # 0.4.x: each chunk's end, as is
            life.req.fill_ids = list(life.tokens[:end])
            self.cache.cache_unfinished_req(life.req)
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
        elif self.sg.release_kv_cache is None:
            # 0.4.x: the request finishes on the token it just sampled, whose KV is never
            # computed; ``cache_finished_req`` caches all but that last token
            req.output_ids.append(OUTPUT_AT_FINISH)
            self.cache.cache_finished_req(req)
            req.output_ids.pop()
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
        life.retractions += 1
        if self.sg.release_req is None:
            self._retract_decode(life)
            return
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

    def _retract_decode(self, life: Life) -> None:
        """0.4.x: SGLang's ``ScheduleBatch.retract_decode`` on a decode batch of this request
        and one that sorts ahead of it (more outputs), so this one is retracted, and only it
        (``retract_decode_steps`` 0 for the call: the eviction SGLang makes after it is left to
        the machine's own draws). The batch's ``filter_batch`` is left out: the batch is
        thrown away."""
        ahead = SimpleNamespace(
            output_ids=[0] * 64, origin_input_ids=[0], sampling_params=life.req.sampling_params
        )
        batch = self.sg.ScheduleBatch.__new__(self.sg.ScheduleBatch)
        batch.reqs = [ahead, life.req]
        batch.seq_lens = torch.tensor([1, life.computed], dtype=torch.int64)
        batch.tree_cache = self.cache
        batch.req_to_token_pool = self.r2t
        batch.token_to_kv_pool_allocator = self.allocator
        batch.is_hybrid = False
        batch.filter_batch = lambda **_kwargs: None
        config = self.sg.global_config.global_config
        steps, config.retract_decode_steps = config.retract_decode_steps, 0
        try:
            retracted, _ = batch.retract_decode(self.sg.server_args)
        finally:
            config.retract_decode_steps = steps
        assert retracted == [life.req], "retract_decode retracted another request"
        life.outputs = [int(t) for t in life.req.output_ids]
        life.admitted = False

    def _evict_to(self, free: int) -> None:
        """Evict from the tree until ``free`` slots are free, as the scheduler's helper does
        (``evict_from_tree_cache``; in 0.4.x ``_evict_tree_cache_if_needed``'s call)."""
        if self.sg.evict_from_tree_cache is not None:
            self.sg.evict_from_tree_cache(self.cache, free)
        elif self.allocator.available_size() < free:
            self.cache.evict(free)

    def evict(self, tokens: int) -> None:
        self._evict_to(self.allocator.available_size() + tokens)

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
