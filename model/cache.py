"""The reference model of the offloading manager (spec sections 2-5 and 9), in plain Python.

How it works and why: docs/internals.md, section model/cache.py.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgate.model.admission import admission_step

Position = Callable[[bytes], "int | None"]
NO_POSITIONS: Position = lambda key: None  # noqa: E731 - a request that gave no positions
POLICY = "chunk_level"  # on_new_request: offload only the chunks this request computes
LOAD_SOURCE = "host"  # get_load_source: a hit comes from the CPU tier


class ModelError(Exception):
    """Protocol misuse: the call breaks the manager's contract."""


class Record:
    """What one request has done in one generation of one manager (spec A2, A5, R1)."""

    def __init__(self, owner: object, generation: int):
        self.owner, self.generation = owner, generation
        self.counted: frozenset = frozenset()  # keys counted toward the threshold
        self.skipped: frozenset = frozenset()  # keys whose skip is in the metric
        self.misses: set = set()  # admitted store misses shown to the policy
        self.seen: dict = {}  # keys in first-sight order (request recency)
        self.inserted: set = set()
        self.reused: set = set()
        self.committed = False
        self.rank: int | None = None  # the request's LRU rank, taken when first needed


def _check(keys) -> list:
    keys = list(keys)
    for k in keys:
        if not isinstance(k, bytes):
            raise ModelError(f"key {k!r} is not bytes")
    return keys


def _group(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big")


def _ordered(keys: list, position: Position) -> list:
    """``keys`` sorted by position when every one has a position, else as they are (stable)."""
    pos = {k: position(k) for k in keys}
    if None in pos.values():
        return keys
    return sorted(keys, key=lambda k: pos[k] or 0)


class Model:
    def __init__(
        self,
        num_chunks: int,
        *,
        store_threshold: int = 1,
        max_tracker_size: int = 64000,
        policy: str = "lru",
        enable_events: bool = True,
        recency: str = "touch",
        slots: dict | None = None,
        feed: str = "offer",
    ):
        for name, value, low in (
            ("num_chunks", num_chunks, 0),
            ("store_threshold", store_threshold, 0),
            ("max_tracker_size", max_tracker_size, 1),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        for label, choice, allowed in (
            ("policy", policy, ("lru", "arc")),
            ("recency", recency, ("touch", "request")),
            ("feed", feed, ("offer", "lookup")),
        ):
            if choice not in allowed:
                raise ValueError(f"{label} must be one of {allowed}, got {choice!r}")
        self.num_chunks, self.policy, self.recency = num_chunks, policy, recency
        self.feed = feed  # where the tracker counts: at offers, or at lookups (spec §3.2)
        self.request = recency == "request"
        self.threshold, self.max_tracker_size = store_threshold, max_tracker_size
        self.enable_events = enable_events
        self.tracker: tuple = ()
        self.generation = 0
        self.slots = {} if slots is None else slots
        self.events: list = []
        self.skips, self.samples = 0, []  # type: tuple[int, list[int]]
        self._empty()

    def _empty(self) -> None:
        self.resident: dict[bytes, dict[str, int]] = {}
        self.fresh, self.freed = list(range(self.num_chunks)), []  # type: list[int], list[int]
        self.rank: dict[bytes, tuple[int, int]] = {}
        self.counter = 0
        lists: tuple[list[bytes], ...] = ([], [], [], [])
        self.t1, self.t2, self.b1, self.b2 = lists
        self.p = 0.0

    # ---- inspection
    @property
    def lru(self) -> list:
        return sorted(self.rank, key=lambda k: (self.rank[k], k))

    def tracker_items(self) -> list:
        return list(self.tracker)

    def policy_state(self) -> dict:
        """The policy's order as plain lists, least recent first (and ARC's p)."""
        if self.policy == "lru":
            return {"lru": self.lru}
        return {
            "t1": list(self.t1),
            "t2": list(self.t2),
            "b1": list(self.b1),
            "b2": list(self.b2),
            "p": self.p,
        }

    def record(self, req) -> Record:
        """``req``'s record in this manager and generation (a new one replaces any other)."""
        rec = self.slots.get(req)
        if rec is None or rec.owner is not self or rec.generation != self.generation:
            rec = self.slots[req] = Record(self, self.generation)
        return rec

    def counted(self, req) -> set:
        rec = self.slots.get(req)
        return (
            set(rec.counted)
            if rec and rec.owner is self and rec.generation == self.generation
            else set()
        )

    # ---- interface answers that depend on nothing but the call (spec section 9)
    def on_new_request(self, req) -> str:
        self.record(req)
        return POLICY

    def get_load_source(self, key: bytes) -> str:
        if self.lookup(key) != "HIT":
            raise ModelError(f"get_load_source: key {key!r} is not a hit")
        return LOAD_SOURCE

    def config_info(self) -> list:
        return [{}]

    def has_pending_work(self) -> bool:
        return False

    # ---- loads
    def lookup(self, key: bytes, req=None) -> str:
        """``req``: the request that looks ``key`` up; where the tracker is fed at lookups
        (spec §3.2) its lookup counts ``key`` as an offer of it counts (spec A2), once per request
        and generation. The model's own lookups, and a harness's, name no request and count
        nothing."""
        _check([key])
        if req is not None and self.feed == "lookup" and self.threshold >= 2:
            rec = self.record(req)
            self.tracker, rec.counted, _, _, _ = admission_step(
                self.tracker,
                rec.counted,
                rec.skipped,
                (key,),
                frozenset(self.resident),
                self.threshold,
                self.max_tracker_size,
            )
        r = self.resident.get(key)
        return "MISS" if r is None else "HIT_PENDING" if r["ref"] < 0 else "HIT"

    def prepare_load(self, keys, req=None, position: Position = NO_POSITIONS) -> list[int]:
        keys = _check(keys)
        for k in keys:
            if self.lookup(k) != "HIT":
                state = "absent" if k not in self.resident else "pending"
                raise ModelError(f"prepare_load: key {k!r} is {state}")
        for k in keys:
            self.resident[k]["ref"] += 1
        if self.request:  # R1: every loaded key is seen and reused
            self._access(self.record(req), keys, keys, position)
        return [self.resident[k]["chunk"] for k in keys]

    def complete_load(self, keys) -> None:
        keys = _check(keys)
        for k in keys:
            if self.resident.get(k, {"ref": 0})["ref"] < keys.count(k):
                raise ModelError(f"complete_load: key {k!r} is not pinned")
        for k in keys:
            self.resident[k]["ref"] -= 1

    # ---- recency
    def _fresh_rank(self, k: bytes) -> None:
        self.counter += 1
        self.rank[k] = (self.counter, 0)

    def _request_rank(self, rec: Record) -> int:
        if rec.rank is None:
            self.counter += 1
            rec.rank = self.counter
        return rec.rank

    def touch(self, keys) -> None:
        for k in reversed(_check(keys)):  # last to first: the first key ends most recent
            if self.policy == "lru":
                if k in self.resident:
                    self._fresh_rank(k)
            elif k in self.t1 and self.resident[k]["ref"] >= 0:
                self.t1.remove(k)
                self.t2.append(k)
            elif k in self.t1 or k in self.t2:
                lst = self.t1 if k in self.t1 else self.t2
                lst.remove(k)
                lst.append(k)
            else:
                self._adapt(k)

    def _adapt(self, k: bytes) -> None:
        """ARC's ghost hit: grow p on a B1 key, shrink it on a B2 key (R6: and the ghost moves
        to its list's recent end)."""
        for ghosts, other, sign in ((self.b1, self.b2, 1), (self.b2, self.b1, -1)):
            if k in ghosts:
                step = sign * max(1, len(other) / len(ghosts))
                self.p = min(float(self.num_chunks), max(0.0, self.p + step))
                if self.request:
                    ghosts.remove(k)
                    ghosts.append(k)
                return

    def _access(self, rec: Record, keys: list, reused: list, position: Position) -> None:
        """R1, R2: record what the request saw and reused; show new keys to the policy."""
        new = [k for k in keys if k not in rec.seen]
        if new and rec.committed:
            raise ModelError(f"a finished request shows new key {new[0]!r}")
        rec.seen.update(dict.fromkeys(new))
        if new and self.policy == "lru":  # R4: first sight lifts a resident key's rank
            rank = self._request_rank(rec)
            for k in new:
                pos = position(k)
                if pos is not None and k in self.resident:
                    self.rank[k] = max(self.rank[k], (rank, -pos))
        rec.reused.update(k for k in reused if k not in rec.inserted)

    def on_request_finished(self, req, position: Position = NO_POSITIONS) -> None:
        """R3: commit the request's recency, once, if its record is this manager's now."""
        rec = self.slots.get(req)
        if (
            not self.request
            or rec is None
            or rec.owner is not self
            or rec.generation != self.generation
            or rec.committed
        ):
            return
        rec.committed = True
        groups: dict = {}
        for k in rec.seen:
            groups.setdefault(_group(k), []).append(k)
        order = _ordered(
            [k for g in sorted(groups) for k in _ordered(groups[g], position)], position
        )
        for k in reversed(order):  # tail first: the head ends most recent
            if k not in self.resident:
                continue
            if self.policy == "lru":
                self._fresh_rank(k)
                continue
            lst = self.t1 if k in self.t1 else self.t2
            if k in rec.inserted and k not in rec.reused:  # R5: insertion only
                lst.remove(k)
                lst.append(k)
            elif k in rec.reused:
                lst.remove(k)
                self.t2.append(k)

    def _victims(self, need: int, ok: set) -> list:
        if self.policy == "lru":
            return sorted(ok, key=lambda k: (self.rank[k], k))[:need]
        victims, t1 = [], len(self.t1)
        limit = int(self.p) if self.request else self.p
        for _ in range(need):
            lists = [self.t1, self.t2] if t1 >= limit else [self.t2, self.t1]
            k = next(k for lst in lists for k in lst if k in ok and k not in victims)
            t1 -= k in self.t1
            victims.append(k)
        return victims

    def _drop(self, k: bytes, ghost: bool) -> None:
        """Remove a resident key and free its chunk; an ARC eviction leaves a ghost."""
        self.freed.append(self.resident.pop(k)["chunk"])
        self.rank.pop(k, None)
        if self.policy == "arc":
            src, ghosts = (self.t1, self.b1) if k in self.t1 else (self.t2, self.b2)
            src.remove(k)
            if ghost:
                ghosts.append(k)

    # ---- stores
    def prepare_store(
        self, keys, req, position: Position = NO_POSITIONS, choose: Callable | None = None
    ):
        """``choose(admitted, need, evictable, free_ids) -> (victims, ids)``: a foreign
        target's choice, applied as given."""
        offer = tuple(dict.fromkeys(_check(keys)))
        rec = self.record(req)
        self.tracker, rec.counted, rec.skipped, admitted, skips = admission_step(
            self.tracker,
            rec.counted,
            rec.skipped,
            offer,
            frozenset(self.resident),
            self.threshold,
            self.max_tracker_size,
            count=self.feed == "offer",
        )
        self.skips += skips
        misses = [k for k in admitted if k not in rec.misses]  # shown once per request
        rec.misses.update(misses)
        if self.policy == "arc":
            for k in reversed(misses) if self.request else misses:
                self._adapt(k)
        if self.request:  # R1: before the allocation check, so a None keeps it
            ready = [k for k in offer if self.resident.get(k, {"ref": -1})["ref"] >= 0]
            self._access(rec, [k for k in offer if k in admitted or k in ready], ready, position)
        if not admitted:
            return [], [], []
        self.samples.append(len(admitted))
        need = max(0, len(admitted) - len(self.fresh) - len(self.freed))
        ok = {k for k, r in self.resident.items() if r["ref"] == 0 and k not in offer}
        if len(ok) < need:
            return None  # spec A8: nothing below this line ran
        if choose is not None:
            free = set(self.fresh) | set(self.freed)
            victims, ids = choose(list(admitted), need, ok, free)
            for k in victims:
                self._drop(k, ghost=True)
            for i in ids:
                (self.fresh if i in self.fresh else self.freed).remove(i)
        else:
            victims = self._victims(need, ok)
            for k in victims:
                self._drop(k, ghost=True)
            ids = [self.fresh.pop(0) if self.fresh else self.freed.pop() for _ in admitted]
        del self.b1[: max(0, len(self.b1) - self.num_chunks)]
        del self.b2[: max(0, len(self.b2) - self.num_chunks)]
        if victims:
            self._event(tuple(victims), True, False)
        for k, i in zip(admitted, ids):
            self.resident[k] = {"chunk": i, "ref": -1}
            if self.policy == "lru":
                pos = position(k) if self.request else None
                if pos is None:
                    self._fresh_rank(k)
                else:
                    self.rank[k] = (self._request_rank(rec), -pos)
            else:
                self.t1.append(k)
                for ghosts in (self.b1, self.b2):
                    if k in ghosts:
                        ghosts.remove(k)
        rec.inserted.update(admitted)
        return list(admitted), ids, victims

    def complete_store(self, keys, success: bool = True, req=None) -> None:
        done = []
        for k in _check(keys):
            if self.resident.get(k, {"ref": 0})["ref"] != -1:
                continue  # not pending: ignored
            if success:
                self.resident[k]["ref"] = 0
            else:
                self._drop(k, ghost=False)
            done.append(k)
        if done:
            self._event(tuple(done), not success, not success, None if not success else req)

    def _event(self, keys: tuple, removed: bool, meta: bool, req=None) -> None:
        if self.enable_events:
            self.events.append((keys, removed, meta, self.generation, req))

    # ---- whole cache
    def reset_cache(self) -> None:
        self._empty()  # tracker counts survive (spec A7); new records start with the new generation
        self.generation += 1

    def take_events(self) -> list:
        """Drains the events as ``(keys, removed, metadata_only, generation, request)``; a
        metadata-only removal loses the keys resident again by now, and is dropped when none is
        left (spec section 5). ``request``: whose store completed (store events)."""
        events, self.events = self.events, []
        out = []
        for keys, removed, meta, generation, req in events:
            if meta:
                keys = tuple(k for k in keys if k not in self.resident)
            if keys:
                out.append((keys, removed, meta, generation, req))
        return out

    def get_stats(self) -> dict:
        refs = [r["ref"] for r in self.resident.values()]
        pending, pinned = sum(r < 0 for r in refs), sum(r > 0 for r in refs)
        frac = (lambda x: x / self.num_chunks) if self.num_chunks else (lambda x: 0.0)
        out = {
            "vllm:kv_offload_cpu_allocation_size": self.samples,
            "vllm:kv_offload_cpu_cache_usage_perc": frac(pending + pinned),
            "vllm:kv_offload_cpu_cache_write_usage_perc": frac(pending),
            "vllm:kv_offload_cpu_cache_read_usage_perc": frac(pinned),
        }
        if self.threshold >= 2:
            out["vllm:kv_offload_stores_skipped"] = self.skips
        self.skips, self.samples = 0, []
        return out
