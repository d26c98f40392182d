"""The request-level checks on top of the oracle (cold admissions, store jobs, events), each
recording its first failure as one line."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any


# ---------------------------------------------------------------------------- request-level checks
class Checks:
    """The checks that sit on top of the oracle (see the module docstring). Each records its
    first failure in ``failure`` (one line), which the machine raises."""

    def __init__(
        self, threshold: int, is_ready: Callable[[bytes], bool], name: Callable[[bytes], str]
    ):
        self.threshold = threshold
        self.is_ready = is_ready
        self.name = name
        self.failure = ""
        self.problems: list[str] = []  # every failure, the first 20 (a replay reads them)
        self.generation = 0
        self.offerers: dict[bytes, set[tuple[int, int]]] = {}
        self.handles: dict[int, tuple[Any, int]] = {}
        self.specs: dict[int, tuple[Any, tuple[bytes, ...]]] = {}  # id(store_spec) -> keys
        self.load_specs: dict[int, tuple[Any, tuple[bytes, ...]]] = {}  # id(load_spec) -> keys
        self.jobs: dict[int, tuple[bytes, ...]] = {}  # open store job -> its keys
        self.flushed_by_reset: set[int] = set()  # jobs a reset flushed (never completed)
        self.completions: list[tuple[bytes, ...]] = []  # complete_store calls of this update
        # (hash, group) of the CPU-tier events, replayed
        self.announced: set[tuple[Any, int]] = set()
        self.dirty: set[bytes] = set()  # keys whose readiness a call may have changed
        self.ready: dict[bytes, tuple[Any, int]] = {}  # ready key -> its name in events
        self.names_of: dict[tuple[Any, int], bytes] = {}
        self.outcome: dict[tuple[int, int, bytes], bool] = {}  # (who, key) -> admitted or not
        self.is_finished: Callable[[str], bool] = lambda req_id: False
        # what happened, for the coverage labels and the replay
        self.stats: Counter[str] = Counter()
        self.cold: list[str] = []  # the cold admissions, in order

    def fail(self, text: str) -> None:
        if not self.failure:
            self.failure = text
        if len(self.problems) < 20:
            self.problems.append(text)

    # --- cold admissions
    def _handle(self, ctx: Any) -> int:
        entry = self.handles.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            entry = (ctx, self.stats["contexts"])
            self.stats["contexts"] += 1
            self.handles[id(ctx)] = entry
        return entry[1]

    def offered(self, keys: list[bytes], ctx: Any) -> None:
        who = (self._handle(ctx), self.generation)
        again = [self.outcome.get((*who, key)) for key in keys]
        if any(a is False for a in again):
            self.stats["retries"] += 1  # a key this request offered before and got None for
        if any(a is True for a in again):
            self.stats["re-offers"] += 1  # a key it offered before with success: a restart
        if self.is_finished(getattr(ctx, "req_id", "")):
            self.stats["finish-time offers"] += 1
            if any(a is False for a in again):
                self.stats["finish-time retries"] += 1
        for key in keys:
            self.offerers.setdefault(key, set()).add(who)
        self._last = (who, keys)

    def prepared(self, keys: list[bytes], ctx: Any, out: Any) -> None:
        who, _ = self._last
        for key in keys:
            self.outcome[(*who, key)] = out is not None
        self.stats["offers"] += 1
        if out is None:
            self.stats["allocation failures"] += 1
            return
        stored = [bytes(k) for k in out.keys_to_store]
        self.dirty.update(stored)
        self.dirty.update(bytes(k) for k in out.evicted_keys)
        self.stats["admitted"] += len(stored)
        if out.evicted_keys:
            self.stats["evictions"] += 1
            self.stats["evicted keys"] += len(out.evicted_keys)
        self.specs[id(out.store_spec)] = (out.store_spec, tuple(stored))
        if self.threshold < 2:
            return
        for key in stored:
            n = len(self.offerers.get(key, ()))
            if n < self.threshold:
                self.stats["cold admissions"] += 1
                self.cold.append(
                    f"{self.name(key)} admitted after {n} distinct request(s) offered it"
                )
                self.fail(
                    f"cold admission: {self.name(key)} was admitted after {n} distinct "
                    f"request(s) offered it, store_threshold={self.threshold}"
                )

    def loaded(self, keys: list[bytes], spec: Any = None) -> None:
        self.stats["loads"] += 1
        self.stats["loaded keys"] += len(keys)
        if spec is not None:
            self.load_specs[id(spec)] = (spec, tuple(bytes(k) for k in keys))

    def jobs_keys(self, store_spec: Any) -> tuple[bytes, ...] | None:
        """The keys of the store spec the manager returned (in its order), or None."""
        entry = self.specs.get(id(store_spec))
        return entry[1] if entry is not None and entry[0] is store_spec else None

    def load_spec_keys(self, load_spec: Any) -> tuple[bytes, ...] | None:
        """The keys a load spec was prepared for (in the order asked), or None."""
        entry = self.load_specs.pop(id(load_spec), None)
        return entry[1] if entry is not None and entry[0] is load_spec else None

    # --- store jobs
    def issued(
        self,
        job_id: int,
        dst_spec: Any,
        gpu_blocks: int,
        blocks_per_chunk: int,
        reach: int | None = None,
    ) -> None:
        """A store job: its GPU blocks fill its chunks whole (``reach``: the chunk blocks its
        KV-cache groups' blocks reach, each from its first chunk's start, where a release
        leaves null blocks out; by default the GPU blocks themselves)."""
        entry = self.specs.pop(id(dst_spec), None)
        if entry is None or entry[0] is not dst_spec:
            self.fail(f"store job {job_id}: its CPU spec is not one the manager returned")
            return
        keys = entry[1]
        if job_id in self.jobs:
            self.fail(f"store job {job_id} issued twice")
        if (gpu_blocks if reach is None else reach) != len(keys) * blocks_per_chunk:
            self.fail(
                f"store job {job_id}: {gpu_blocks} GPU block(s) for {len(keys)} "
                f"chunk(s) of {blocks_per_chunk} block(s)"
            )
        self.jobs[job_id] = keys

    def completed(self, keys: list[bytes]) -> None:
        self.stats["completed keys"] += len(keys)
        self.dirty.update(bytes(k) for k in keys)
        # In any order: 0.33.0 keeps a job's keys in a set, 0.34.0 in prefix order.
        self.completions.append(tuple(sorted(bytes(k) for k in keys)))

    def reported(self, store_jobs: Iterable[int]) -> None:
        """After an update whose output reported ``store_jobs`` done: each open one got exactly
        one complete_store of its keys in that update, and no other complete_store came."""
        expected: Counter[tuple[bytes, ...]] = Counter()
        for job in store_jobs:
            if job in self.flushed_by_reset:
                self.stats["stale completions"] += 1
                continue
            keys = self.jobs.pop(job, None)
            if keys is None:
                self.fail(f"store job {job} reported done, but it is not open")
                continue
            expected[tuple(sorted(keys))] += 1
        got = Counter(self.completions)
        self.completions = []
        if got != expected:
            extra, missing = got - expected, expected - got
            what = []
            if missing:
                what.append(
                    "no complete_store for " + "; ".join(self._keys(k) for k in missing.elements())
                )
            if extra:
                what.append(
                    "complete_store with no store job reported for it: "
                    + "; ".join(self._keys(k) for k in extra.elements())
                )
            self.fail("store jobs: " + ", ".join(what))

    def _keys(self, keys: tuple[bytes, ...]) -> str:
        return "[" + ", ".join(self.name(k) for k in keys) + "]"

    def reset(self) -> None:
        self.generation += 1
        self.stats["stale keys"] += sum(len(keys) for keys in self.jobs.values())
        self.flushed_by_reset.update(self.jobs)
        self.jobs.clear()
        self.specs.clear()
        self.announced.clear()  # the replay starts over at a reset, as the oracle's does
        self.dirty.update(self.ready)
        self.stats["resets"] += 1

    # --- events
    def published(self, events: Iterable[Any]) -> None:
        """Replay the CPU-tier events of one published batch. Events name a block by its
        hash as vLLM publishes it (``external``) and its group."""
        for event in events:
            if getattr(event, "medium", None) != "CPU":
                continue
            group = int(getattr(event, "group_idx", None) or 0)
            names = {(h, group) for h in getattr(event, "block_hashes", ())}
            if type(event).__name__ == "BlockRemoved":
                self.announced -= names
            elif type(event).__name__ == "BlockStored":
                self.announced |= names

    def check_events(self, external: Callable[[bytes], Any]) -> None:
        """After an update (every event drained): the announced keys are the ready keys.
        Incremental: only keys a call named since the last check are looked up again."""
        for key in self.dirty:
            name = (external(key[:-4]), int.from_bytes(key[-4:], "big"))
            self.names_of[name] = key
            if self.is_ready(key):
                self.ready[key] = name
            else:
                self.ready.pop(key, None)
        self.dirty.clear()
        ready = set(self.ready.values())
        if ready != self.announced:

            def named(n):
                return self.name(self.names_of[n]) if n in self.names_of else repr(n)

            more = sorted(named(n) for n in self.announced - ready)
            less = sorted(named(n) for n in ready - self.announced)
            self.fail(
                "published CPU events differ from the manager's ready keys: "
                + ", ".join(
                    filter(
                        None,
                        [
                            f"announced but not ready {more}" if more else "",
                            f"ready but never announced {less}" if less else "",
                        ],
                    )
                )
            )
