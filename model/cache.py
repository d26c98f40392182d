"""The reference model of the offloading manager (SPEC sections 2-5 and 9), in plain Python.

State (all plain values, read directly by the invariants):

- ``resident``: key -> {"chunk": id, "ref": n}; ref -1 pending, 0 ready and idle, n > 0 pinned.
- ``lru``: resident keys, least recent first (policy "lru"). ``t1``, ``t2``, ``b1``, ``b2``:
  ARC's lists, least recent first, and ``p`` (a float) (policy "arc").
- ``fresh``: never-used chunk ids, increasing; ``freed``: freed ids, a stack (last freed last).
- ``tracker``: tuple of (key, count), least recent first; ``tracker_items()`` gives a list.
- ``records``: (req, generation) -> {"counted", "skipped", "shown"}; ``shown`` holds the keys
  the request has shown ARC as store misses. ``generation``: bumped by ``reset_cache``.

Choices where the SPEC is silent:

- Below threshold 2 the tracker stays empty and stats carry no skip counter.
- Keys must be ``bytes`` in every call, else ``ModelError`` naming the key, before any change.
- Only offers are deduplicated. Elsewhere each occurrence counts, in order: ``prepare_load([k,
  k])`` pins k twice, ``complete_load`` needs a ref count >= the occurrences of each key, and a
  repeat in ``complete_store`` is no longer pending, so it is ignored. Loading a pinned key is
  allowed (ref + 1).
- Nothing admitted (empty offer, all resident, all skipped): ``([], [], [])``, no sample, no event.
- ARC: every admitted key is marked shown, whether or not it was a ghost; adaptation runs in
  offer order. A key in both B1 and B2 cannot happen (insert removes from both).
- ``reset_cache`` emits no event and keeps queued events and unreported stats (skips, allocation
  samples), as upstream does: an event replay starts over from the empty set at a reset, and
  the events of an older generation drained after it describe a cache that is gone. Records of
  older generations are simply never read again.
- ``choice`` (section 9) is consulted only when the model's own answer is not ``None`` (whether an
  offer fits does not depend on the policy). An illegal choice raises ``ModelError`` after the
  offer was recorded (the run is a failure anyway). Adopted victims' chunks are freed in the
  given order, then the adopted ids leave the free pool.
- Events are never empty.
"""
from __future__ import annotations

from kvgate.model.admission import admission_step


class ModelError(Exception):
    """Protocol misuse or an illegal foreign choice."""


class AdmissionDiffers(ModelError):
    """A foreign target stored other keys than the model admits."""

    def __init__(self, admitted):
        super().__init__(f"the model admits {list(admitted)!r}")
        self.admitted = list(admitted)


def _check(keys) -> list:
    keys = list(keys)
    for k in keys:
        if not isinstance(k, bytes):
            raise ModelError(f"key {k!r} is not bytes")
    return keys


class Model:
    def __init__(self, num_chunks: int, policy: str = "lru", store_threshold: int = 1,
                 max_tracker_size: int = 64000):
        for name, value, low in (("num_chunks", num_chunks, 0), ("store_threshold", store_threshold, 0),
                                 ("max_tracker_size", max_tracker_size, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if policy not in ("lru", "arc"):
            raise ValueError(f"policy must be 'lru' or 'arc', got {policy!r}")
        self.num_chunks, self.policy = num_chunks, policy
        self.threshold, self.max_tracker_size = store_threshold, max_tracker_size
        self.tracker: tuple = ()
        self.generation = 0
        self.records: dict = {}
        self.events: list = []
        self.skips, self.samples = 0, []
        self._empty()

    def _empty(self) -> None:
        self.resident: dict = {}
        self.fresh, self.freed = list(range(self.num_chunks)), []
        self.lru, self.t1, self.t2, self.b1, self.b2 = [], [], [], [], []
        self.p = 0.0

    # ---- inspection
    def tracker_items(self) -> list:
        return list(self.tracker)

    def policy_state(self) -> dict:
        """The policy's order as plain lists, least recent first (and ARC's p)."""
        if self.policy == "lru":
            return {"lru": list(self.lru)}
        return {"t1": list(self.t1), "t2": list(self.t2), "b1": list(self.b1),
                "b2": list(self.b2), "p": self.p}

    def counted(self, req) -> set:
        rec = self.records.get((req, self.generation))
        return set(rec["counted"]) if rec else set()

    # ---- loads
    def lookup(self, key: bytes) -> str:
        _check([key])
        r = self.resident.get(key)
        return "MISS" if r is None else "HIT_PENDING" if r["ref"] < 0 else "HIT"

    def prepare_load(self, keys) -> list[int]:
        keys = _check(keys)
        for k in keys:
            if self.lookup(k) != "HIT":
                state = "absent" if k not in self.resident else "pending"
                raise ModelError(f"prepare_load: key {k!r} is {state}")
        for k in keys:
            self.resident[k]["ref"] += 1
        return [self.resident[k]["chunk"] for k in keys]

    def complete_load(self, keys) -> None:
        keys = _check(keys)
        for k in keys:
            if self.resident.get(k, {"ref": 0})["ref"] < keys.count(k):
                raise ModelError(f"complete_load: key {k!r} is not pinned")
        for k in keys:
            self.resident[k]["ref"] -= 1

    # ---- policy
    def touch(self, keys) -> None:
        for k in reversed(_check(keys)):  # last to first: the first key ends most recent
            if self.policy == "lru":
                if k in self.resident:
                    self.lru.remove(k)
                    self.lru.append(k)
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
        """ARC's ghost hit: grow p on a B1 key, shrink it on a B2 key."""
        if k in self.b1:
            self.p = min(float(self.num_chunks), self.p + max(1, len(self.b2) / len(self.b1)))
        elif k in self.b2:
            self.p = max(0.0, self.p - max(1, len(self.b1) / len(self.b2)))

    def _victim(self, ok: set) -> bytes:
        if self.policy == "lru":
            lists = [self.lru]
        else:
            lists = [self.t1, self.t2] if len(self.t1) >= self.p else [self.t2, self.t1]
        return next(k for lst in lists for k in lst if k in ok)

    def _drop(self, k: bytes, ghost: bool) -> None:
        """Remove a resident key and free its chunk; an ARC eviction leaves a ghost."""
        self.freed.append(self.resident.pop(k)["chunk"])
        if self.policy == "lru":
            self.lru.remove(k)
        else:
            src, ghosts = (self.t1, self.b1) if k in self.t1 else (self.t2, self.b2)
            src.remove(k)
            if ghost:
                ghosts.append(k)

    # ---- stores
    def prepare_store(self, keys, req, choice=None, stored=None):
        """``choice``/``stored``: a foreign target's (evicted, chunk ids) and stored keys."""
        offer = tuple(dict.fromkeys(_check(keys)))
        rec = self.records.setdefault((req, self.generation),
                                      {"counted": frozenset(), "skipped": frozenset(), "shown": set()})
        self.tracker, rec["counted"], rec["skipped"], admitted, skips = admission_step(
            self.tracker, rec["counted"], rec["skipped"], offer, frozenset(self.resident),
            self.threshold, self.max_tracker_size)
        if stored is not None and list(stored) != list(admitted):
            raise AdmissionDiffers(admitted)
        self.skips += skips
        if admitted:
            self.samples.append(len(admitted))
        if self.policy == "arc":  # a store miss is shown once per request per generation
            for k in admitted:
                if k not in rec["shown"]:
                    rec["shown"].add(k)
                    self._adapt(k)
        need = max(0, len(admitted) - len(self.fresh) - len(self.freed))
        ok = {k for k, r in self.resident.items() if r["ref"] == 0 and k not in offer}
        if len(ok) < need:
            return None  # A8: nothing below this line ran
        if choice is not None:
            victims, ids = self._legal(choice, need, ok, len(admitted))
            for k in victims:
                self._drop(k, ghost=True)
            for i in ids:
                (self.fresh if i in self.fresh else self.freed).remove(i)
        else:
            victims = []
            for _ in range(need):
                victims.append(self._victim(ok))
                self._drop(victims[-1], ghost=True)
            ids = [self.fresh.pop(0) if self.fresh else self.freed.pop() for _ in admitted]
        del self.b1[:max(0, len(self.b1) - self.num_chunks)]
        del self.b2[:max(0, len(self.b2) - self.num_chunks)]
        if victims:
            self.events.append((tuple(victims), True, False, self.generation))
        for k, i in zip(admitted, ids):
            self.resident[k] = {"chunk": i, "ref": -1}
            if self.policy == "lru":
                self.lru.append(k)
            else:
                self.t1.append(k)
                for ghosts in (self.b1, self.b2):
                    if k in ghosts:
                        ghosts.remove(k)
        return list(admitted), ids, victims

    def _legal(self, choice, need: int, ok: set, n: int) -> tuple[list, list]:
        """Check a foreign target's (evicted_keys, chunk_ids) against SPEC section 9."""
        victims, ids = list(choice[0]), list(choice[1])
        if len(victims) != need or len(set(victims)) != need or not set(victims) <= ok:
            raise ModelError(f"illegal eviction {victims!r}: need {need} distinct ready, idle keys "
                             f"outside the offer, from {sorted(ok)!r}")
        free = set(self.fresh) | set(self.freed) | {self.resident[k]["chunk"] for k in victims}
        if len(ids) != n or len(set(ids)) != n or not set(ids) <= free:
            raise ModelError(f"illegal chunk ids {ids!r}: need {n} distinct ids from {sorted(free)}")
        return victims, ids

    def complete_store(self, keys, success: bool = True) -> None:
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
            self.events.append((tuple(done), not success, not success, self.generation))

    # ---- whole cache
    def reset_cache(self) -> None:
        self._empty()  # tracker counts survive (A7); new records start with the new generation
        self.generation += 1

    def take_events(self, generations: bool = False) -> list:
        """Drains the events; a metadata-only removal loses the keys resident again by now,
        and is dropped when none is left (amended section 5). ``generations``: each event with
        the generation it was made in, ``(event, generation)``: events queued before a reset
        are drained after it, and describe a cache that is gone."""
        events, self.events = self.events, []
        out = []
        for keys, removed, meta, generation in events:
            if meta:
                keys = tuple(k for k in keys if k not in self.resident)
            if keys:
                out.append(((keys, removed, meta), generation) if generations
                           else (keys, removed, meta))
        return out

    def get_stats(self) -> dict:
        refs = [r["ref"] for r in self.resident.values()]
        pending, pinned = sum(r < 0 for r in refs), sum(r > 0 for r in refs)
        frac = (lambda x: x / self.num_chunks) if self.num_chunks else (lambda x: 0.0)
        out = {"vllm:kv_offload_cpu_allocation_size": self.samples,
               "vllm:kv_offload_cpu_cache_usage_perc": frac(pending + pinned),
               "vllm:kv_offload_cpu_cache_write_usage_perc": frac(pending),
               "vllm:kv_offload_cpu_cache_read_usage_perc": frac(pinned)}
        if self.threshold >= 2:
            out["vllm:kv_offload_stores_skipped"] = self.skips
        self.skips, self.samples = 0, []
        return out
