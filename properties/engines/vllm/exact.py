"""What the connector's scheduler side says and keeps, checked exactly (issue 30, items 2 and 3).

- **hits exact**: the tokens ``get_num_new_matched_tokens`` reports as loadable are the longest
  hit the CPU tier can serve at that moment under the example's KV-cache layout (layouts.py:
  with one full-attention group, the longest run of chunks from the chunk that holds the first
  token not computed on the GPU), capped by the request's keyed chunks, its tokens and the
  scheduler's ``max_num_new_tokens``, and 0 below one chunk; a request's ``max_load_tokens``
  (its ``kv_transfer_params``) caps the load at the last chunk boundary within that many
  tokens (with a sliding-window group, a connector that also takes the window's last token off
  the capped length, as 0.33.0's does, is accepted: a smaller hit, never wrong KV); beside a
  recurrent (Mamba) group with no drafter the longest servable hit on a chunk boundary, or on
  a block hash boundary below the prompt's last token (a partial tail), where every lookup of
  the call was settled and no chunk is being loaded; else, and with a drafter beside it, a
  hit is judged servable (layouts.py);
- **unsettled lookups waited for**: a hit given although a manager lookup of that call
  answered ``HIT_PENDING`` or ``RETRY`` (a tiered manager's answers: front.tiered_answer) is
  the hit with those chunks not readable and the same with them readable;
- **deferred for a cause**: a lookup answers ``None`` (ask again later) only while something
  it waits for can change the answer: a transfer job of the request's own, a load of a chunk
  its hit spans, or a manager lookup in that call that answered neither hit nor miss (a chunk
  still being stored); with nothing in flight a deferred request waits forever;
- **offered once**: a chunk a request offered and the manager accepted (``prepare_store`` did
  not answer ``None``) is not offered again by that request until it is preempted or the cache
  is reset (a ``None`` leaves it to be offered again: a retry);
- **offered in time**: after a step's metadata is built, each request the step scheduled has
  offered every chunk its batch completes (that metadata's stores, or earlier since it last
  started at chunk 0), or loaded it, on the group that **offered at all** judges;
- **offload capped**: a request that sent ``max_offload_tokens`` offers no chunk ending past
  it, and the two checks below ask only for the chunks within it;
- **offered at all**: when a request finishes that ran since it last started at chunk 0 (its
  admission, a preemption, a cache reset: the reset empties the tier, so a running request
  offers its chunks again), every chunk of its computed prefix that may be offloaded (the
  prompt's, with ``offload_prompt_only``) was offered since then, or loaded (the connector's
  final offer comes in the step after the request ends);
- **hand-offs offered**: beside a recurrent group with no drafter, each state the scheduler
  hands off at a boundary within what the request may offload was offered, or loaded, since
  the request last started at chunk 0, by the time the step's metadata is built;
- **kept after finish**: a finished request's context goes on saying the token counts it said
  when the manager heard the request finished, after the connector dropped the request (a
  tier's deferred callback reads it then);
- **told right**: the manager hears of a request (``on_new_request``) before any call names its
  context, and the context says what the request is: its prompt's length, its tokens while it
  runs, each key it offers at the position its chunk ends (a key with no position is told
  wrong), and the tiers its ``kv_load_tiers`` names
  (load_tiers.py; where the release's context has these);
- **reset passed on**: a reset of the connector's cache reaches the manager as exactly one
  ``reset_cache``;
- **hit sources told right**: what the connector tells the engine of an admitted hit's tiers
  (``get_external_cache_hit_sources``, read by vLLM's prefix-cache metrics) adds up to the hit,
  holds positive counts only, names only tiers the manager named for the keys the request
  loads (or ``external_unspecified``), and, with full attention alone, gives every token of
  the hit to those tiers;
- **shutdown passed on**: when the scheduler shuts down, a manager that has ``shutdown`` hears
  it exactly once (its threads and pinned memory are released there);
- **never idle with work**: the scheduler goes idle (no request, no push work pending) only
  when the connector tracks no transfer job (their completions come only from later steps);
- **configuration once**: the tier's configuration (``config_info``) is asked of the manager
  once, for the first stats payload (where the connector says it sends it once), and that
  payload carries it, whether or not the manager reports stats of its own;
- **metric exact**: the connector's own allocation-failure counter (which its stats carry to
  the scheduler after each update) adds up to the ``None`` answers of ``prepare_store``;
- **the manager's lock**: every manager call of the connector comes inside the manager's lock;
  a ``schedule()`` holds it as one region from its first manager call to the end of its
  metadata (a lock let go between a lookup's hit and the load or store that relies on it lets
  another thread, a tier-poll thread, in between: the call before and after the gap are
  named); and no region of it is still held once a step's metadata is built or an update is
  applied (the manager is free while the model runs);
- **nothing left behind**: after each step's metadata, the connector keeps per-request state
  only for requests that are still running or still have transfers in flight, tracks only jobs
  the worker has not reported (a cache reset waits only for such jobs of those it flushed),
  and pins GPU blocks and loading chunks only for such jobs.

Its known-bad connectors (planted faults) are in faults.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import private_names as pn
from .checks import Checks
from .layouts import offload_key
from .load_tiers import told

ALLOCATION_FAILURE = "vllm:kv_offload_allocation_failure"  # the connector's own counter
CONFIG_INFO = "info"  # the stats payload's field of the tier's configuration (config_info)
UNSPECIFIED = "external_unspecified"  # CacheHitSource's value for tokens of no known tier
# what a request context says of its request (where the release's context has them)
TOKEN_COUNTS = ("num_prompt_tokens", "num_tokens", "num_computed_tokens", "num_in_flight_tokens")


class ExactChecks:
    """Wraps the connector's scheduler side (instance attributes only) and checks it."""

    def __init__(
        self,
        engine: Any,
        checks: Checks,
        is_ready: Callable[[bytes], bool],
    ):
        self.engine = engine
        self.checks = checks
        self.is_ready = is_ready
        self.conn = engine.connector
        self.chunk_tokens = engine.setup.block_size * engine.setup.blocks_per_chunk
        self.epoch: dict[str, int] = {}  # req_id -> preemptions seen
        self.reset_preempted: set[str] = set()  # preempted by a reset, not yet named again
        self.accepted: dict[tuple, set[bytes]] = {}  # (req, generation, epoch) -> keys
        self.announced: set[str] = set()  # requests the manager heard of
        self.failures_reported = 0  # the connector's allocation-failure metric, summed
        self.conservative: int | None = None  # the hit of a capped window's other reading
        self.offers: dict[tuple, set[bytes]] = {}  # (req, generation, epoch) -> keys offered
        self.loads: dict[tuple, set[bytes]] = {}  # (req, generation, epoch) -> keys loaded
        self.in_reset = False
        self.ran: set[tuple] = set()  # (req, generation, epoch) scheduled at least once
        self.unsettled = 0  # manager lookups answered neither hit nor miss
        self.unsettled_keys: set[bytes] = set()  # their keys, in the lookup being judged
        self.assume: dict[bytes, bool] = {}  # readiness assumed of keys, in place of the tier's
        self.handoffs: dict[str, list] = {}  # the step's recurrent state hand-offs, by request
        self.frozen: dict[str, tuple[Any, dict]] = {}  # finished req -> (context, its counts)
        self.stats = checks.stats
        self._wrap()

    # ------------------------------------------------------------------ wrapping
    def _wrap(self) -> None:
        conn = self.conn
        original = conn.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, num_computed_tokens, *args, **kwargs):
            want = self._expected_hit(request, num_computed_tokens, *args, **kwargs)
            unsettled, self.unsettled_keys = self.unsettled, set()
            got = original(request, num_computed_tokens, *args, **kwargs)
            hit = got[0] if isinstance(got, tuple) else got
            if hit is None and self.unsettled == unsettled:
                self._deferred_for_nothing(request, num_computed_tokens, want)
            self._judge_hit(request, num_computed_tokens, hit, want)
            if self.engine.setup.layout.recurrent is not None:
                max_new = kwargs.get("max_num_new_tokens", args[0] if args else None)
                self._judge_recurrent(request, num_computed_tokens, hit, max_new)
            elif hit is not None and self.unsettled_keys:
                self._judge_unsettled(request, num_computed_tokens, hit, args, kwargs)
            return got

        conn.get_num_new_matched_tokens = get_num_new_matched_tokens
        build_meta = conn.build_connector_meta

        def build_connector_meta(scheduler_output, *args, **kwargs):
            # the scheduler drops its block state once the metadata is built: read it here
            state = getattr(scheduler_output, "kv_connector_block_state", None)
            offloads = getattr(state, "boundary_state_offloads", None) or {}
            self.handoffs = {r: list(entries) for r, entries in offloads.items()}
            return build_meta(scheduler_output, *args, **kwargs)

        conn.build_connector_meta = build_connector_meta
        reset_cache = conn.reset_cache

        def reset_cache_watched(*args, **kwargs):
            self.in_reset = True
            told = self.engine.front.calls["reset_cache"]
            try:
                out = reset_cache(*args, **kwargs)
            finally:
                self.in_reset = False
            if self.engine.front.calls["reset_cache"] != told + 1:
                self.checks.fail(
                    "the connector's cache was reset (reset_prefix_cache with "
                    f"reset_connector=True) and its manager heard reset_cache "
                    f"{self.engine.front.calls['reset_cache'] - told} time(s)"
                )
            return out

        conn.reset_cache = reset_cache_watched
        self._watch_hit_sources()
        get_stats = getattr(conn, "get_stats", None)
        if get_stats is not None:

            def counted_get_stats():
                first = not getattr(conn, pn.INFO_SENT, True)
                stats = get_stats()
                if first and (getattr(stats, "data", None) or {}).get(CONFIG_INFO) is None:
                    self.checks.fail(
                        f"the connector's first stats payload ({stats!r:.80}) carries no tier "
                        "configuration: the config-info metric never reaches the frontend"
                    )
                asked = self.engine.front.calls["config_info"]
                if hasattr(conn, pn.INFO_SENT) and asked > 1:
                    self.checks.fail(
                        f"the connector asked its manager's config_info {asked} times; the "
                        "tier's configuration rides on the first stats payload only"
                    )
                reduce = getattr(stats, "reduce", None)
                if reduce is not None:
                    n = sum(v for k, v in reduce().items() if k.startswith(ALLOCATION_FAILURE))
                    self.failures_reported += n
                return stats

            conn.get_stats = counted_get_stats

    # ------------------------------------------------------------------ hit sources
    def _watch_hit_sources(self) -> None:
        """The tiers the connector tells the engine an admitted hit came from
        (``get_external_cache_hit_sources``, where the release has it), beside the tiers the
        manager named for the keys it loads (``get_load_source``, asked in that call)."""
        conn, front = self.conn, self.engine.front
        sources = getattr(conn, "get_external_cache_hit_sources", None)
        source_of = getattr(front, "get_load_source", None)
        if sources is None or source_of is None:
            return
        told: list[str] = []

        def get_load_source(*args, **kwargs):
            out = source_of(*args, **kwargs)
            told.append(str(getattr(out, "value", out)))
            return out

        def get_external_cache_hit_sources(request, num_external_tokens, *args, **kwargs):
            told.clear()
            got = sources(request, num_external_tokens, *args, **kwargs)
            self._judge_sources(request, num_external_tokens, got, set(told))
            return got

        front.get_load_source = get_load_source
        conn.get_external_cache_hit_sources = get_external_cache_hit_sources

    def _judge_sources(self, request: Any, hit: int, got: Any, told: set[str]) -> None:
        """**hit sources told right**: the per-tier token counts of an admitted hit hold only
        non-zero counts and add up to the hit; each tier named is one the manager named for a
        key the request loads, or ``external_unspecified`` (tokens no loaded key covers); with
        full attention alone every token of the hit is loaded, so it all comes from the tiers
        the manager named (its one tier, for a CPU manager)."""
        req = getattr(request, "request_id", "?")
        counts = {str(getattr(k, "value", k)): v for k, v in dict(got or {}).items()}
        shown = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "nothing"
        head = f"the connector told the engine {req}'s hit of {hit} tokens came from {shown}"
        if any(not isinstance(v, int) or v <= 0 for v in counts.values()):
            return self.checks.fail(f"{head}; the counts are positive token counts only")
        if sum(counts.values()) != hit:
            return self.checks.fail(f"{head}, {sum(counts.values())} tokens in all")
        unknown = set(counts) - told - {UNSPECIFIED}
        if unknown:
            return self.checks.fail(
                f"{head}; the manager named {', '.join(sorted(told)) or 'no tier'} for the "
                "keys the request loads"
            )
        layout = self.engine.setup.layout
        plain = not layout.sliding and layout.recurrent is None and layout.eagle is None
        if plain and told and UNSPECIFIED in counts:
            self.checks.fail(
                f"{head}; with full attention alone every token of the hit is loaded from a "
                f"tier the manager named ({', '.join(sorted(told))})"
            )
        self.stats["hit sources told"] += 1
        return None

    # ------------------------------------------------------------------ hits
    def _keys(self, request: Any, group: int = 0, every_hash: bool = False) -> list[bytes]:
        """Each chunk's key in ``group`` (``every_hash``: each block hash's)."""
        per = 1 if every_hash else self.engine.setup.hashes_per_chunk
        return [
            offload_key(h, group) for i, h in enumerate(request.block_hashes) if (i + 1) % per == 0
        ]

    def _partial_hit_servable(self, request, num_computed: int, hit: int, is_ready=None) -> bool:
        """With a recurrent group: whether the tier holds what a hit of ``hit`` tokens after
        ``num_computed`` needs (layouts.py; ``is_ready``: whether a key is ready, the tier's
        word by default)."""
        is_ready = is_ready or self.is_ready
        layout, setup = self.engine.setup.layout, self.engine.setup
        end = num_computed + hit
        keys = [self._keys(request, g, every_hash=True) for g in range(len(layout.windows))]
        if (
            end % setup.hash_size
            or end // setup.hash_size > len(keys[0])
            or end >= request.num_tokens
        ):
            return False

        def ready(group: int, index: int) -> bool:
            return index < len(keys[group]) and is_ready(keys[group][index])

        start = num_computed // self.chunk_tokens
        return layout.serves_partial(end, start, self.chunk_tokens, setup.hash_size, ready)

    def _longest_recurrent(
        self, request, num_computed: int, max_new: int | None, ready
    ) -> set[int]:
        """Beside a recurrent group, on a layout with no drafter: the hits a connector may
        give. The longest the tier can serve (``ready(key)``), ending on a chunk boundary
        below the request's last token, or on a block hash boundary below its prompt's last
        token (a partial tail); the longest with its partial tail searched for only in the
        block after the longest complete-chunk hit; with a ``max_load_tokens`` cap, the hit
        of a connector that takes the last token off the capped length (as with a window: a
        smaller hit, never wrong KV)."""
        setup, chunk = self.engine.setup, self.chunk_tokens
        size = setup.hash_size
        keyed = len(request.block_hashes) * size
        # the caps beside the request's own length (a capped load's reading below drops it)
        caps = [keyed] + ([] if max_new is None else [num_computed + max_new])
        cap: Any = (request.kv_transfer_params or {}).get("max_load_tokens")
        capped = type(cap) is int and cap >= 0
        if capped:
            caps.append(num_computed + cap)
        upto = min(request.num_tokens - 1, *caps)

        def longest(upto: int, prompt_end: int) -> int:
            for end in range(upto - upto % size, num_computed, -size):
                if end % chunk and end > prompt_end:
                    continue
                if self._partial_hit_servable(request, num_computed, end - num_computed, ready):
                    return end - num_computed
            return 0

        prompt_end = request.num_prompt_tokens - 1
        # a connector may search for a partial tail only in the block after the longest
        # complete-chunk hit (0.33.0's does; 0.34.0 searches from the full-attention prefix)
        complete = longest(upto, num_computed)
        hits = {
            longest(upto, prompt_end),
            longest(upto, min(prompt_end, num_computed + complete + chunk - 1)),
        }
        if capped:
            hits.add(longest(min(request.num_tokens, *caps) - 1, prompt_end))
        return hits

    def _judge_recurrent(
        self, request, num_computed: int, hit: int | None, max_new: int | None
    ) -> None:
        """Beside a recurrent group with no drafter, where every lookup of the call was
        settled and no chunk is being loaded: a hit is the longest the tier can serve."""
        layout = self.engine.setup.layout
        if hit is None or layout.eagle is not None:
            return
        if self.unsettled_keys or getattr(self.conn, pn.CHUNKS_LOADING, None):
            # which boundaries a lookup gives up or waits on while a chunk is unsettled or
            # being loaded is the release's own policy (each release differs); served is
            # judged (_partial_hit_servable), longest only where all is settled
            self.stats["recurrent hits judged servable only"] += 1
            return
        hits = self._longest_recurrent(request, num_computed, max_new, self.is_ready)
        want = max(hits)
        if hit not in hits:
            what = "a shorter" if hit < want else "a longer"
            self.checks.fail(
                f"{'missed' if hit < want else 'phantom'} hit: the connector reported {hit} "
                f"loadable token(s) for {request.request_id} after {num_computed} computed on "
                f"the GPU beside a recurrent group, {what} hit than the {want} token(s) the "
                "CPU tier can serve then (every group's chunks ready)"
            )

    def _expected_hit(self, request, num_computed, max_num_new_tokens=None, *_, **kw) -> int:
        """The longest hit the CPU tier can serve now, as the layout says (layouts.py)."""
        max_num_new_tokens = kw.get("max_num_new_tokens", max_num_new_tokens)
        layout = self.engine.setup.layout
        if layout.recurrent is not None:
            return 0  # judged after the call, on what it looked up (_judge_recurrent)
        tokens = self.chunk_tokens
        keys = [self._keys(request, g) for g in range(len(layout.windows))]
        start = num_computed // tokens
        # the request's last token is recomputed where a window needs it
        end = min(request.num_tokens - layout.sliding, len(keys[0]) * tokens)
        if max_num_new_tokens is not None:
            end = min(end, num_computed + max_num_new_tokens)
        cap = (request.kv_transfer_params or {}).get("max_load_tokens")
        capped = None
        if type(cap) is int and cap >= 0:  # loads end on a chunk boundary within the cap
            capped = min(end, num_computed + cap)
            capped -= capped % tokens
        ready: dict[tuple[int, int], bool] = {}

        def is_ready(group: int, chunk: int) -> bool:
            if (group, chunk) not in ready:
                key = keys[group][chunk]
                assumed = self.assume.get(key)
                ready[(group, chunk)] = self.is_ready(key) if assumed is None else assumed
            return ready[(group, chunk)]

        def longest(end: int) -> int:
            """The longest servable hit ending at ``end`` or at a chunk boundary below it."""
            ends = [end] + list(range((end - 1) // tokens * tokens, 0, -tokens))
            for e in ends:
                if e - num_computed < tokens:
                    return 0
                if layout.servable(e, start, tokens, len(keys[0]), is_ready):
                    return e - num_computed
            return 0

        hit = longest(end if capped is None else capped)
        if capped is not None and capped < end and not self.assume and longest(end) > hit:
            self.stats["capped hits"] += 1
        self.conservative = None
        if capped is not None and layout.sliding:
            # A connector may take the token a window needs off the capped length as well
            # (0.33.0's does): one token less before the chunk boundary, never wrong KV.
            low = min(request.num_tokens, num_computed + cap)
            if max_num_new_tokens is not None:
                low = min(low, num_computed + max_num_new_tokens)
            low = min(low - 1, len(keys[0]) * tokens)
            self.conservative = longest(low - low % tokens)
        return hit

    def shut_down(self, told: int, front: Any) -> None:
        """After the scheduler's shutdown: the manager heard ``shutdown`` once, where it has
        one."""
        real = getattr(front, "real", None)
        if told != 1 and callable(getattr(real, "shutdown", None)):
            self.checks.fail(
                f"the scheduler shut down and its connector's manager heard shutdown {told} time(s)"
            )

    def looked_up(self, answer: Any, key: bytes) -> None:
        """A manager lookup's answer (from the connector, through the front)."""
        if getattr(answer, "name", None) not in ("HIT", "MISS") and not isinstance(answer, int):
            self.unsettled += 1
            self.unsettled_keys.add(key)
            self.stats[f"lookups answered {getattr(answer, 'name', answer)}"] += 1

    def _judge_unsettled(self, request, num_computed: int, hit: int, args, kwargs) -> None:
        """A hit given although a lookup in the same call answered neither hit nor miss
        (``HIT_PENDING``: held, not yet readable; ``RETRY``: ask again later): it is the hit
        with those chunks not readable, and the hit with them readable, or the connector
        waits (answers ``None``). A longer hit could be had by waiting; a hit over them
        reads a chunk the tier has not said it can serve."""
        conservative, hits = self.conservative, dict[bool, set[int]]()
        for readable in (False, True):
            self.assume = dict.fromkeys(self.unsettled_keys, readable)
            try:
                want = self._expected_hit(request, num_computed, *args, **kwargs)
            finally:
                self.assume = {}
            other = self.conservative
            hits[readable] = {want} if other is None else {want, other}
        self.conservative = conservative
        self.stats["hits beside unsettled lookups"] += 1
        if hit not in hits[False]:
            self.checks.fail(
                f"phantom hit: the connector reported {hit} loadable token(s) for "
                f"{request.request_id} after {num_computed} computed on the GPU, over a chunk "
                "the manager answered HIT_PENDING or RETRY for in that lookup (not readable)"
            )
        elif hit not in hits[True]:
            self.checks.fail(
                f"missed hit: the connector reported {hit} loadable token(s) for "
                f"{request.request_id} after {num_computed} computed on the GPU, where the "
                "manager answered HIT_PENDING or RETRY for a chunk that makes the hit longer "
                f"({max(hits[True])} token(s)) once readable: it should have waited (None)"
            )

    def _deferred_for_nothing(self, request: Any, num_computed: int, want: int) -> None:
        """A lookup answered ``None`` while every manager lookup in it was settled: only a
        transfer of the request's own, or a load of a chunk its hit needs, can change the
        answer (where the release says what it loads: else any transfer it tracks)."""
        conn, req_id = self.conn, request.request_id
        if not hasattr(conn, pn.JOBS):
            return  # a release that does not say what it tracks
        jobs = getattr(conn, pn.JOBS)
        loading = getattr(conn, pn.CHUNKS_LOADING, None)
        if not hasattr(conn, pn.CHUNKS_LOADING):
            if jobs or getattr(conn, pn.RESET_FENCE, None) or self.engine.worker.in_flight:
                return
        elif any(getattr(j, "req_id", None) == req_id for j in jobs.values()) or any(
            r == req_id for _, r in self.engine.worker.in_flight.values()
        ):
            return
        elif loading:
            # the chunks its hit spans, every group's (beside a recurrent group, whose hit is
            # judged servable only and may end inside a chunk: every block hash's key)
            groups = range(len(self.engine.setup.layout.windows))
            if self.engine.setup.layout.recurrent is not None:
                spans = [self._keys(request, g, every_hash=True) for g in groups]
            else:
                first = num_computed // self.chunk_tokens
                end = -(-(num_computed + max(want, self.conservative or 0)) // self.chunk_tokens)
                spans = [self._keys(request, g)[first:end] for g in groups]
            if any(k in loading for keys in spans for k in keys):
                return
        self.checks.fail(
            f"the connector deferred {req_id}'s lookup (answered None) with every manager "
            "lookup settled, no transfer of its own in flight and no chunk of its hit "
            f"({want} token(s)) being loaded: nothing it waits for can change its answer"
        )

    def _judge_hit(self, request, num_computed, hit, want) -> None:
        if hit is None:
            self.stats["deferred lookups"] += 1
            return
        self.stats["hits judged"] += 1
        if self.engine.setup.layout.recurrent is not None:
            if hit and (num_computed + hit) % self.chunk_tokens:
                self.stats["partial hits"] += 1
            if hit and not self._partial_hit_servable(request, num_computed, hit):
                self.checks.fail(
                    f"phantom hit: the connector reported {hit} loadable token(s) for "
                    f"{request.request_id} after {num_computed} computed on the GPU, but the "
                    "CPU tier cannot serve a hit ending there (the recurrent state after it, "
                    "or a full-attention chunk below it, is not ready)"
                )
            return
        if hit != want and hit == self.conservative:
            self.stats["capped window hits a token short"] += 1
            return
        if want:
            self.stats["servable hits"] += 1
        if hit != want:
            what = "phantom hit" if hit > want else "missed hit"
            self.checks.fail(
                f"{what}: the connector reported {hit} loadable token(s) for "
                f"{request.request_id} after {num_computed} computed on the GPU, but the CPU "
                f"tier can serve {want} then"
            )

    # ------------------------------------------------------------------ offers
    def scheduled(self, req_ids) -> None:
        for req_id in req_ids:
            self.ran.add(self._who(req_id))

    def preempted(self, req_ids, by_reset: bool = False) -> None:
        """Requests sent back to chunk 0. A reset that preempts the running requests names
        them again in the next step's scheduler output: one restart, counted once."""
        if by_reset:
            self.reset_preempted.update(req_ids)
        else:
            req_ids = [r for r in req_ids if r not in self.reset_preempted]
            self.reset_preempted.clear()
        for req_id in req_ids:
            self.epoch[req_id] = self.epoch.get(req_id, 0) + 1

    def new_request(self, ctx: Any) -> None:
        req_id = str(getattr(ctx, "req_id", ""))
        self.announced.add(req_id)
        self.frozen.pop(req_id, None)  # a session's next input: the request lives again
        wrong = told(ctx, self.engine.transfer_params.get(req_id))
        if wrong:
            self.checks.fail(wrong)

    def named(self, call: str, ctx: Any) -> None:
        """A manager call with a request's context: the manager must have heard of it."""
        if ctx is None:
            return
        req_id = str(getattr(ctx, "req_id", ""))
        if req_id not in self.announced:
            self.checks.fail(
                f"the manager was asked {call} for {req_id} before on_new_request told it of "
                "that request"
            )
        self._counts_right(ctx, req_id, call)
        wrong = told(ctx, self.engine.transfer_params.get(req_id))  # at every call, too
        if wrong:
            self.checks.fail(f"{wrong} (at {call})")

    def _who(self, req_id: str) -> tuple:
        return (req_id, self.checks.generation, self.epoch.get(req_id, 0))

    def loaded(self, keys: list[bytes], ctx: Any) -> None:
        req_id = str(getattr(ctx, "req_id", ""))
        self.loads.setdefault(self._who(req_id), set()).update(bytes(k) for k in keys)

    def finished(self, ctx: Any) -> None:
        """``on_request_finished``, from the step after the request ended (not from a cache
        reset, which ends requests whose finish-time offer never came): every chunk of its
        computed, offloadable prefix was offered since it last restarted at chunk 0 (a
        preemption, a reset), or loaded. What its context says now is what it must go on
        saying (``kept_after_finish``)."""
        req_id = str(getattr(ctx, "req_id", ""))
        self.frozen[req_id] = (ctx, _counts_of(ctx))
        if self.in_reset:
            return
        request = self.engine.requests.get(req_id)
        if request is None:
            return
        from vllm.v1.request import RequestStatus

        computed = request.num_computed_tokens
        if request.status != RequestStatus.FINISHED_ABORTED:
            computed = min(computed, max(request.num_prompt_tokens, request.num_tokens - 1))
        missed = self._not_offered(request, computed)
        if missed:
            self.checks.fail(
                f"{req_id} finished with {computed} offloadable token(s) computed, but "
                f"{', '.join(self.checks.name(k) for k in missed)} never offered to the "
                "manager since it last started at chunk 0"
            )

    def kept_after_finish(self, when: str) -> None:
        """A finished request's context goes on saying the token counts it said when the
        manager heard the request finished, after the connector dropped the request too: a
        tier's deferred callback (a store that completes later) reads it then."""
        for req_id, (ctx, said) in list(self.frozen.items()):
            now = _counts_of(ctx)
            if now != said:
                field = next(f for f in said if now[f] != said[f])
                del self.frozen[req_id]
                self.checks.fail(
                    f"the manager's context of {req_id} said {field} {said[field]} when the "
                    f"request finished and says {now[field]} {when}"
                )

    def offered_in_time(self, scheduled: Any) -> None:
        """After a step's metadata is built: each request the step scheduled has offered
        every chunk its batch completes (in that metadata, or earlier since it last started
        at chunk 0), or loaded it: the store reads the blocks right after the batch, before a
        later step can free them, and the next request can find the chunk."""
        for req_id in scheduled:
            request = self.engine.sched.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            # the scheduler has counted the batch's tokens as computed
            missed = self._not_offered(request, request.num_computed_tokens)
            if missed:
                self.checks.fail(
                    f"{req_id}'s batch completed {', '.join(self.checks.name(k) for k in missed)}"
                    f" ({request.num_computed_tokens} token(s) computed after it), but neither "
                    "the step's metadata nor an earlier one since the request last started at "
                    "chunk 0 offered it to the manager"
                )

    def handoffs_offered(self) -> None:
        """After a step's metadata is built: each recurrent state the scheduler handed off at
        a boundary (``boundary_state_offloads``: a copy of the state after exactly that many
        tokens) within what the request may offload was offered to the manager, or loaded,
        since the request last started at chunk 0: a later request can resume from that
        state only if it is stored (with a drafter the release's proof margin decides, so
        not judged there)."""
        layout = self.engine.setup.layout
        handoffs, self.handoffs = self.handoffs, {}
        if layout.recurrent is None or layout.eagle is not None:
            return
        size = self.engine.setup.hash_size
        for req_id, entries in handoffs.items():
            request = self.engine.sched.requests.get(req_id)
            if request is None or req_id not in getattr(self.conn, pn.REQ_STATUS, {}):
                continue
            offload_cap = self._offload_cap(req_id)
            cap = request.num_prompt_tokens if offload_cap is None else offload_cap
            cap = min(cap, request.num_prompt_tokens)
            who = self._who(req_id)
            seen = self.offers.get(who, set()) | self.loads.get(who, set())
            keys = self._keys(request, layout.recurrent, every_hash=True)
            for group, block_id, boundary in entries:
                if group != layout.recurrent or not block_id or boundary > cap:
                    continue
                self.stats["state hand-offs"] += 1
                key = keys[boundary // size - 1] if 0 < boundary <= len(keys) * size else None
                if key is not None and key not in seen:
                    self.checks.fail(
                        f"the scheduler handed off {req_id}'s recurrent state after {boundary} "
                        "token(s) (within what it may offload), but neither the step's metadata "
                        "nor an earlier one since the request last started at chunk 0 offered "
                        f"{self.checks.name(key)} to the manager: no later request can resume "
                        "from it"
                    )

    def _not_offered(self, request: Any, computed: int) -> list[bytes]:
        """The keys of the full-attention group's chunks within ``computed`` tokens (the
        prompt's, with ``offload_prompt_only``) that ``request`` has neither offered since it
        last started at chunk 0 nor loaded; none where the layout does not judge offers or
        the request has not been scheduled since it restarted."""
        if self.engine.setup.offload_prompt_only:
            computed = min(computed, request.num_prompt_tokens)
        cap = self._offload_cap(request.request_id)
        if cap is not None:
            computed = min(computed, cap)
        who = self._who(request.request_id)
        if who not in self.ran:
            return []  # not scheduled since it last restarted (a preemption, a cache reset)
        covered = self.offers.get(who, set())
        # the full-attention group's chunks (a sliding-window group skips the chunks no window
        # can reach, a drafter's group its last while decoding)
        group = self.engine.setup.layout.checked_offers
        if group is None:
            return []
        every = self._keys(request, group)
        keys = every[: computed // self.chunk_tokens]
        loaded = self.loads.get(who, set())
        # A chunk-level offloading context skips the chunks a load covered, and the GPU hits
        # before them: everything up to the last chunk loaded (which may lie past a cap).
        upto = max((i + 1 for i, k in enumerate(every) if k in loaded), default=0)
        return [k for k in keys[upto:] if k not in covered]

    def _offload_cap(self, req_id: str) -> int | None:
        """The request's ``max_offload_tokens``, where it sent a valid one."""
        cap = self.engine.transfer_params.get(req_id, {}).get("max_offload_tokens")
        return cap if type(cap) is int and cap >= 0 else None

    def offered(self, keys: list[bytes], ctx: Any, out: Any) -> None:
        req_id = str(getattr(ctx, "req_id", ""))
        self._told_right(keys, ctx, req_id)
        cap = self._offload_cap(req_id)
        if cap is not None:
            ends = {k: len(p) for k in keys if (p := self.engine.prefix_of(k)) is not None}
            past = [k for k, end in ends.items() if end > cap]
            if past:
                self.checks.fail(
                    f"{req_id} offered {', '.join(self.checks.name(k) for k in past)} (ending "
                    f"at token {max(ends[k] for k in past)}), past its max_offload_tokens of {cap}"
                )
        who = self._who(req_id)
        self.offers.setdefault(who, set()).update(keys)
        if out is None:
            return
        done = self.accepted.setdefault(who, set())
        again = [k for k in keys if k in done]
        if again:
            self.checks.fail(
                f"{req_id} offered {', '.join(self.checks.name(k) for k in again)} again, after "
                "the manager accepted it, with no preemption or cache reset since"
            )
        done.update(keys)

    def _counts_right(self, ctx: Any, req_id: str, call: str = "prepare_store") -> bool:
        """The context's token counts are the request's, at every call that names it while
        the request lives (not only when it was made); False after the first that is not."""
        request = self.engine.sched.requests.get(req_id)
        if request is None:
            return True
        for field, said in _counts_of(ctx).items():
            if said != getattr(request, field):
                self.checks.fail(
                    f"the manager's context of {req_id} says {field} {said} at {call}; the "
                    f"request has {getattr(request, field)}"
                )
                return False
        return True

    def _told_right(self, keys: list[bytes], ctx: Any, req_id: str) -> None:
        if not self._counts_right(ctx, req_id):
            return
        position = getattr(ctx, "get_offload_key_position", None)
        if position is None:
            return
        for key in keys:
            prefix = self.engine.prefixes.get(key)
            try:
                at = position(key)
            except Exception:
                at = None
            if prefix is not None and at != len(prefix):
                where = f"at token {at}" if at is not None else "nowhere (no position)"
                self.checks.fail(
                    f"the manager's context puts {self.checks.name(key)} of {req_id} {where}; "
                    f"its chunk ends at token {len(prefix)}"
                )
                return

    # ------------------------------------------------------------------ the connector's metric
    def updated(self, settled: bool) -> None:
        """After an update: the connector's allocation-failure metric has reported no more
        ``None`` answers of ``prepare_store`` than there were, and, once every scheduled batch
        has been updated (``settled``), exactly as many."""
        counted = self.stats["allocation failures"]
        if self.failures_reported > counted or (settled and self.failures_reported != counted):
            self.checks.fail(
                f"the connector's {ALLOCATION_FAILURE} metric reported "
                f"{self.failures_reported} failed store allocation(s); prepare_store answered "
                f"None {counted} time(s)"
            )

    # ------------------------------------------------------------------ the manager's lock
    def locked_call(self, name: str, held: int, let_go: str | None = None, call: str = "") -> None:
        """The connector enters the manager only inside the manager's lock, and holds it for
        one region from a ``schedule()``'s first manager call to the end of its metadata
        (where it has one: a release whose connector holds a step region). ``let_go``: the
        call after which this ``schedule()`` let the lock go, where it did."""
        if not hasattr(self.conn, pn.ACQUIRE_STEP):
            return
        if held <= 0:
            self.checks.fail(f"the connector called the manager's {name} outside its lock")
        elif let_go is not None:
            self.checks.fail(
                f"the connector let the manager's lock go inside one schedule(), after "
                f"{let_go} and before {call or name}: another thread (a tier-poll thread) "
                "can enter the manager there and evict what the step already found"
            )

    def lock_free(self, held: int, when: str) -> None:
        if held and hasattr(self.conn, pn.ACQUIRE_STEP):
            self.checks.fail(f"the manager's lock is still held {when}")

    # ------------------------------------------------------------------ idle
    def idle(self) -> None:
        """The scheduler says it has nothing to do: the connector must be waiting on no job
        (where it says when the engine must keep stepping)."""
        jobs = getattr(self.conn, pn.JOBS, None)
        if jobs and hasattr(self.conn, "has_pending_push_work"):
            self.checks.fail(
                f"the scheduler went idle while the connector tracks job(s) {sorted(jobs)} in "
                "flight: no later step hears them complete"
            )

    # ------------------------------------------------------------------ state left behind
    def after_schedule(self, in_flight: set[int]) -> None:
        """After a step's metadata is built: what the connector keeps, and for whom."""
        conn = self.conn
        statuses = getattr(conn, pn.REQ_STATUS, None)
        jobs = getattr(conn, pn.JOBS, None)
        if statuses is None or jobs is None:
            return
        requests = self.engine.sched.requests
        for req_id, status in list(statuses.items()):
            request = requests.get(req_id)
            live = request is not None and not request.is_finished()
            if not live and not getattr(status, "transfer_jobs", None):
                self.checks.fail(
                    f"the connector still keeps {req_id}'s state after it finished and its "
                    "transfers settled"
                )
                return
        unknown = sorted(set(jobs) - in_flight)
        if unknown:
            self.checks.fail(
                f"the connector still tracks job(s) {unknown} the worker has reported done"
            )
        fenced = sorted(set(getattr(conn, pn.RESET_FENCE, None) or ()) - in_flight)
        if fenced:
            self.checks.fail(
                f"a cache reset still waits for job(s) {fenced} it flushed, which the worker "
                "has reported done: the tier stays held for the reset"
            )
        pending = getattr(conn, pn.PENDING_JOBS, None) or {}
        for block, ids in pending.items():
            if not set(ids) <= set(jobs):
                self.checks.fail(
                    f"the connector fences GPU block {block} for job(s) it no longer tracks"
                )
                return
        loading = getattr(conn, pn.CHUNKS_LOADING, None) or set()
        load_keys = {k for j in jobs.values() if not j.is_store for k in j.keys}
        left = [k for k in loading if k not in load_keys]
        if left:
            self.checks.fail(
                f"the connector marks {self.checks.name(bytes(left[0]))} as being loaded with "
                "no load in flight"
            )


def _counts_of(ctx: Any) -> dict[str, Any]:
    """What a request context says of its request's token counts (those its release has)."""
    out: dict[str, Any] = {}
    for field in TOKEN_COUNTS:
        if hasattr(type(ctx), field):
            try:
                out[field] = getattr(ctx, field)
            except Exception as exc:
                out[field] = f"nothing ({type(exc).__name__})"
    return out
