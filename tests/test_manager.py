"""Examples of impl's offloading manager (spec §2-§5 and §8).

The seed's two tests, one scenario per admission claim (spec A1-A8), then LRU, ARC, chunk ids,
failed stores, reset, events, gauges and bad input. Each scenario is a function of a manager
factory that returns what it observed, with no assertion of its own; one table (``CLAIMS``)
says what impl must observe in each, and for each variant that breaks the claim (the
catalogue's, properties/catalogue/managers.py, or a local one) the fields in which it must observe
something else.

Keys are written by name ("a" is ``make_key(b"a")``) and results are shown by name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from kvgate.impl.base import LookupResult, OffloadingEvent, ReqContext, make_key
from kvgate.impl.manager import OffloadingManager
from kvgate.impl.tracker import AdmissionTracker
from kvgate.properties.catalogue.managers import MUTANTS

IMPL = OffloadingManager


# --------------------------------------------------------------------------- helpers


def K(name: str) -> bytes:
    return make_key(name.encode())


def N(key: bytes) -> str:
    return key[:-4].decode()


def names(keys) -> list[str]:
    return [N(k) for k in keys]


def keys_of(spec) -> list[bytes]:
    """``"abc"`` or ``["a", "b"]`` -> keys."""
    return [K(n) for n in spec]


E, C = K("eligible"), K("cold")


def new(make, num_chunks: int, T: int = 1, policy: str = "lru", tracker: int = 64_000):
    """A manager from ``make`` (impl's class, a catalogue ``Mutant`` or a local subclass)."""
    return make(num_chunks, cache_policy=policy, store_threshold=T, max_tracker_size=tracker)


def offer(m, spec, ctx) -> list[str] | None:
    """One offer; the names stored, or ``None``."""
    out = m.prepare_store(keys_of(spec), ctx)
    return None if out is None else names(out.keys_to_store)


def store(m, spec, rid: str = "x", complete: bool = True):
    """Offer ``spec`` through a new request and complete what it stores."""
    out = m.prepare_store(keys_of(spec), ReqContext(rid))
    if out is not None and complete:
        m.complete_store(out.keys_to_store)
    return out


def count(m, key: bytes) -> int:
    return m.tracker.counts.get(key, 0)


def tracker_items(m) -> list[tuple[str, int]]:
    return [(N(k), n) for k, n in m.tracker.counts.items()]


def events(m) -> list[tuple[list[str], bool, bool]]:
    return [(names(e.keys), e.removed, e.metadata_only) for e in m.take_events()]


def skipped(m):
    return m.get_stats().stores_skipped


def policy_state(m):
    p = m._policy
    if hasattr(p, "order"):
        return names(p.order)
    return names(p.t1), names(p.t2), names(p.b1), names(p.b2), p.p


def snapshot(m, spec) -> dict:
    """Everything observable about ``m`` for the keys of ``spec`` (drains events and stats)."""
    stats = m.get_stats().as_dict()
    return {
        "lookup": {n: m.lookup(K(n)).name for n in spec},
        "ref": {n: m.ref_count(K(n)) for n in spec},
        "chunk": {n: m.chunk_of(K(n)) for n in spec},
        "free": m.free_chunks,
        "tracker": tracker_items(m) if m.tracker is not None else None,
        "policy": policy_state(m),
        "events": events(m),
        "stats": stats,
        "generation": m.generation,
    }


def fill_in_flight(m, spec, T: int) -> list[bytes]:
    """Admit ``spec`` through T distinct requests and leave the stores in flight."""
    for r in range(T - 1):
        m.prepare_store(keys_of(spec), ReqContext(f"fill{r}"))
    out = m.prepare_store(keys_of(spec), ReqContext("fill"))
    return [] if out is None else list(out.keys_to_store)


def warm(m, key: bytes, times: int) -> None:
    """``times`` other requests offer ``key`` (T - 1 makes it eligible at the next offer)."""
    for r in range(times):
        m.prepare_store([key], ReqContext(f"warm{r}"))


# --------------------------------------------------------------------------- the seed's tests


@pytest.mark.parametrize("T", [2, 3])
def test_seed_retry_of_a_failed_offer_does_not_count(T):
    m = OffloadingManager(2, store_threshold=T)
    filler = fill_in_flight(m, ["f0", "f1"], T)
    assert filler == keys_of(["f0", "f1"])
    warm(m, E, T - 1)  # E is counted T - 1 times by other requests
    m.get_stats()
    req = ReqContext("req")
    assert m.prepare_store([E, C], req) is None
    assert m.prepare_store([E, C], req) is None  # the retry
    m.complete_store(filler)
    out = m.prepare_store([E, C], req)
    assert out.keys_to_store == [E]
    assert out.evicted_keys == [K("f0")]
    assert m.tracker.counts[C] == 1 and m.tracker.counts[E] == T
    assert m.get_stats().stores_skipped == 1


@pytest.mark.parametrize("T", [2, 3])
def test_seed_preempted_request_counts_a_key_once(T):
    m = OffloadingManager(2, store_threshold=T)
    warm(m, E, T - 1)
    m.get_stats()
    req = ReqContext("req")
    out = m.prepare_store([E, C], req)
    assert (out.keys_to_store, out.store_spec, out.evicted_keys) == ([E], [0], [])
    m.complete_store([E])
    out = m.prepare_store([E, C], req)  # resumed: same context, stores from chunk 0 again
    assert (out.keys_to_store, out.store_spec, out.evicted_keys) == ([], [], [])
    assert m.lookup(C) is LookupResult.MISS
    assert m.tracker.counts[C] == 1
    assert m.get_stats().stores_skipped == 1
    other = m.prepare_store([C], ReqContext("other"))  # another request still counts it
    assert m.tracker.counts[C] == 2
    assert other.keys_to_store == ([C] if T == 2 else [])


# --------------------------------------------------------------------------- spec A1


class TrackerBelowTwo(OffloadingManager):
    """Spec A1 broken: below threshold 2 a tracker still exists and filters at 2 (with a skip
    metric), as if the threshold were clamped up."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tracker is None:
            self.tracker = AdmissionTracker(2, 64_000)


def scenario_a1(make, T: int = 1) -> dict:
    m = new(make, 4, T=T)
    r = ReqContext("r")
    first = offer(m, "ab", r)
    second = offer(m, "abc", r)  # a, b resident: only c
    return {
        "offers": [first, second],
        "no_tracker": m.tracker is None,
        "skip_metric": m.get_stats().stores_skipped,
    }


A1 = {"offers": [["a", "b"], ["c"]], "no_tracker": True, "skip_metric": None}


# --------------------------------------------------------------------------- spec A2


def scenario_a2(make) -> dict:
    # A retry after None and the re-offer of a preempted request, through one context.
    m = new(make, 1, T=2)
    filler = fill_in_flight(m, ["f"], 2)
    warm(m, E, 1)
    r = ReqContext("r")
    offers, cold = [], []
    offers.append(offer(m, ["eligible", "cold"], r))  # None: recorded first
    cold.append(count(m, C))
    offers.append(offer(m, ["eligible", "cold"], r))  # the retry: None again
    cold.append(count(m, C))
    m.complete_store(filler)
    offers.append(offer(m, ["eligible", "cold"], r))  # stores the eligible key only
    cold.append(count(m, C))
    m.complete_store([E])
    offers.append(offer(m, ["eligible", "cold"], r))  # resumed after preemption
    cold.append(count(m, C))

    # A re-offer refreshes a tracked key; a key dropped meanwhile enters again with count 1
    # (spec A2): the tracker forgot r's earlier count, so that 1 is r's only one.
    m = new(make, 4, T=2, tracker=3)
    r = ReqContext("r")
    offer(m, "a", r)
    offer(m, "b", ReqContext("s"))
    offer(m, "a", r)  # no count, but a moves to the recent end
    refreshed = tracker_items(m)
    offer(m, "c", ReqContext("x"))
    offer(m, "d", ReqContext("y"))  # pushes out the least recent: b
    after_push = tracker_items(m)
    offer(m, "e", ReqContext("z"))  # pushes out a
    offer(m, "a", r)  # r counted a before it was dropped: it enters again, count 1
    dropped = tracker_items(m)
    offer(m, "a", r)  # and r's next re-offer does not take it to 2
    dropped.append(count(m, K("a")))

    # A key repeated inside one offer is one offer of it.
    m = new(make, 4, T=2)
    offer(m, "zz", ReqContext("r"))
    return {
        "offers": offers,
        "cold_count": cold,
        "refreshed": refreshed,
        "after_push": after_push,
        "dropped_retracked": dropped,
        "repeat_count": count(m, K("z")),
    }


A2 = {
    "offers": [None, None, ["eligible"], []],
    "cold_count": [1, 1, 1, 1],
    "refreshed": [("b", 1), ("a", 1)],
    "after_push": [("a", 1), ("c", 1), ("d", 1)],
    "dropped_retracked": [("d", 1), ("e", 1), ("a", 1), 1],
    "repeat_count": 1,
}


# --------------------------------------------------------------------------- spec A3


def scenario_a3(make) -> dict:
    m = new(make, 4, T=2)
    first = offer(m, "a", ReqContext("r1"))
    second = offer(m, "a", ReqContext("r2"))  # another request counts: a reaches 2
    offer(m, "b", ReqContext("same"))
    third = offer(m, "b", ReqContext("same"))  # a new context with the same req_id
    return {
        "offers": [first, second, third],
        "counts": {"a": count(m, K("a")), "b": count(m, K("b"))},
    }


A3 = {"offers": [[], ["a"], ["b"]], "counts": {"a": 2, "b": 2}}


# --------------------------------------------------------------------------- spec A4


def scenario_a4(make) -> dict:
    m = new(make, 8, T=2, tracker=2)
    offer(m, "a", ReqContext("x"))
    offer(m, "b", ReqContext("y"))
    stored = offer(m, "abc", ReqContext("z"))  # a, b refreshed and protected: c not tracked
    full_protected = tracker_items(m)
    offer(m, "de", ReqContext("w"))  # d pushes out a, then e pushes out b
    entered_in_order = tracker_items(m)

    m = new(make, 8, T=2, tracker=2)
    offer(m, "a", ReqContext("x"))
    offer(m, "b", ReqContext("y"))
    offer(m, "ca", ReqContext("z"))  # a refreshed first, then c pushes out b (not a)
    return {
        "stored": stored,
        "full_protected": full_protected,
        "cold_count": count(m, K("c")),
        "entered_in_order": entered_in_order,
        "refresh_before_enter": tracker_items(m),
    }


A4 = {
    "stored": ["a", "b"],
    "full_protected": [("a", 2), ("b", 2)],
    "cold_count": 1,
    "entered_in_order": [("d", 1), ("e", 1)],
    "refresh_before_enter": [("a", 2), ("c", 1)],
}


# --------------------------------------------------------------------------- spec A5


def scenario_a5(make) -> dict:
    m = new(make, 4, T=2, tracker=2)
    steps = []

    def step(spec, ctx):
        steps.append((offer(m, spec, ctx), skipped(m)))

    r = ReqContext("r")
    step("ab", r)  # both skipped
    step("ab", r)  # the same request again: no new skip
    step("a", ReqContext("s"))  # a reaches 2: stored
    step("p", ReqContext("x"))
    step("q", ReqContext("y"))  # a is pushed out of the tracker (count 0)
    step("a", ReqContext("t"))  # pending: not a candidate, never skipped, not stored again
    pending = m.lookup(K("a")).name
    m.complete_store([K("a")])
    step("a", ReqContext("u"))  # ready: the same
    return {"steps": steps, "pending": pending, "events": events(m)}


A5 = {
    "steps": [([], 2), ([], 0), (["a"], 0), ([], 1), ([], 1), ([], 0), ([], 0)],
    "pending": "HIT_PENDING",
    "events": [(["a"], False, False)],
}


def scenario_a5_first_skip(make) -> dict:
    # spec A5: "once" is the request's first offer that skips the key, not its first offer.
    m = new(make, 4, T=2, tracker=1)
    steps = []

    def step(spec, ctx):
        steps.append((offer(m, spec, ctx), skipped(m)))

    r = ReqContext("r")
    step("a", ReqContext("s"))  # a: count 1, skipped
    step("a", r)  # count 2: r's offer admits it
    m.complete_store([K("a")], success=False)  # the store fails: a is absent again
    step("b", ReqContext("x"))  # pushes a out of the tracker
    step("a", r)  # a enters with count 1: r's first skip of a counts
    step("a", r)  # and only once
    return {"steps": steps}


A5_FIRST_SKIP = {"steps": [([], 1), (["a"], 0), ([], 1), ([], 1), ([], 0)]}


# --------------------------------------------------------------------------- spec A6


def scenario_a6(make, T: int) -> dict:
    m = new(make, 8, T=T)
    for r in range(T - 1):
        offer(m, "ac", ReqContext(f"w{r}"))
    for r in range(T - 2):
        offer(m, "b", ReqContext(f"v{r}"))
    out = m.prepare_store(keys_of("cbad"), ReqContext("req"))
    return {
        "stored": names(out.keys_to_store),
        "ids": out.store_spec,
        "counts": {n: count(m, K(n)) for n in "abcd"},
    }


def a6_expected(T: int) -> dict:
    return {"stored": ["c", "a"], "ids": [0, 1], "counts": {"a": T, "b": T - 1, "c": T, "d": 1}}


# --------------------------------------------------------------------------- spec A7


def scenario_a7(make) -> dict:
    m = new(make, 4, T=3)
    r = ReqContext("r")
    before = (offer(m, "a", r), skipped(m), count(m, K("a")))
    m.reset_cache()
    count_after_reset = count(m, K("a"))
    reoffer = (offer(m, "a", r), skipped(m), count(m, K("a")))  # counts and skips again
    other = offer(m, "a", ReqContext("s"))  # the third request: a reaches 3
    return {
        "before": before,
        "count_after_reset": count_after_reset,
        "after_reoffer": reoffer,
        "stored_by_other": other,
        "generation": m.generation,
    }


A7 = {
    "before": ([], 1, 1),
    "count_after_reset": 1,
    "after_reoffer": ([], 1, 2),
    "stored_by_other": ["a"],
    "generation": 1,
}


# --------------------------------------------------------------------------- spec A8


def scenario_a8(make) -> dict:
    m = new(make, 3)
    store(m, "ab")
    store(m, "c", complete=False)
    m.prepare_load([K("b")])  # a idle, b pinned, c pending: one evictable chunk
    m.take_events()
    m.get_stats()
    out = m.prepare_store(keys_of("def"), ReqContext("r"))  # needs 3
    state = snapshot(m, "abcdef")
    return {"out": out, "state": state}


A8 = {
    "out": None,
    "state": {
        "lookup": {
            "a": "HIT",
            "b": "HIT",
            "c": "HIT_PENDING",
            "d": "MISS",
            "e": "MISS",
            "f": "MISS",
        },
        "ref": {"a": 0, "b": 1, "c": -1, "d": None, "e": None, "f": None},
        "chunk": {"a": 0, "b": 1, "c": 2, "d": None, "e": None, "f": None},
        "free": 0,
        "tracker": None,
        "policy": ["a", "b", "c"],
        "events": [],
        "stats": {
            "vllm:kv_offload_cpu_allocation_size": [3],
            "vllm:kv_offload_cpu_cache_usage_perc": 2 / 3,
            "vllm:kv_offload_cpu_cache_write_usage_perc": 1 / 3,
            "vllm:kv_offload_cpu_cache_read_usage_perc": 1 / 3,
        },
        "generation": 0,
    },
}


# --------------------------------------------------------------------------- offers


def scenario_dedup(make) -> dict:
    m = new(make, 4)
    out = m.prepare_store(keys_of("aab"), ReqContext("r"))
    return {"stored": names(out.keys_to_store), "ids": out.store_spec, "free": m.free_chunks}


DEDUP = {"stored": ["a", "b"], "ids": [0, 1], "free": 2}


# --------------------------------------------------------------------------- LRU


def scenario_lru(make) -> dict:
    m = new(make, 4)
    store(m, "abcd")  # insert: a least recent ... d most recent
    m.touch(keys_of("ab"))  # walked b then a: a ends most recent -> c d b a
    touched = policy_state(m)
    evicted = names(store(m, "xyz").evicted_keys)  # the three least recent: c d b

    m = new(make, 3)
    store(m, "abc")
    m.prepare_load([K("a")])  # pinned
    out = m.prepare_store(keys_of("bd"), ReqContext("r"))  # a pinned, b in the offer: c
    evicted2 = None if out is None else names(out.evicted_keys)

    m = new(make, 2)
    store(m, "a", complete=False)  # pending and least recent
    store(m, "b")
    evicted3 = names(store(m, "c").evicted_keys)  # b: a pending store is not evictable
    return {"touched": touched, "evicted": evicted, "evicted2": evicted2, "evicted3": evicted3}


LRU = {
    "touched": ["c", "d", "b", "a"],
    "evicted": ["c", "d", "b"],
    "evicted2": ["c"],
    "evicted3": ["b"],
}


# --------------------------------------------------------------------------- ARC


def scenario_arc(make) -> dict:
    m = new(make, 4, policy="arc")
    states = {}
    store(m, "abcd")
    m.touch(keys_of("ab"))  # ready keys in T1 move to T2 (walked b then a)
    states["touched"] = policy_state(m)
    store(m, "e")  # |T1| >= p = 0: T1's least recent (c) goes to B1
    states["t1_victim"] = policy_state(m)
    m.prepare_load(keys_of("de"))  # T1's ready keys pinned: victims come from T2
    store(m, "f", complete=False)
    store(m, "g", complete=False)
    m.touch([K("f")])  # a pending key in T1 stays in T1 (moved to its recent end)
    states["t2_victims"] = policy_state(m)
    r = ReqContext("r")
    p = []
    p.append((offer(m, "c", r), m._policy.p))  # c in B1: p += max(1, |B2|/|B1|) = 2; None
    p.append((offer(m, "c", r), m._policy.p))  # the retry: no second adaptation
    p.append((offer(m, "c", ReqContext("s")), m._policy.p))  # another request: 2 + 2 = 4
    p.append((offer(m, "c", ReqContext("t")), m._policy.p))  # 4 + 2, capped at 4
    m.complete_load([K("d")])
    p.append((offer(m, "c", r), m._policy.p))  # |T1| >= p: d goes to B1; c leaves B1
    p.append((offer(m, "a", ReqContext("u")), m._policy.p))  # a in B2: p -= max(1, 1/2)
    states["p"] = p

    m = new(make, 3, policy="arc")
    store(m, "abc")
    for n in "defg":
        store(m, n)  # each evicts T1's least recent into B1
    states["ghosts"] = policy_state(m)
    return states


ARC = {
    "touched": (["c", "d"], ["b", "a"], [], [], 0),
    "t1_victim": (["d", "e"], ["b", "a"], ["c"], [], 0),
    "t2_victims": (["d", "e", "g", "f"], [], ["c"], ["b", "a"], 0),
    "p": [(None, 2), (None, 2), (None, 4), (None, 4), (["c"], 4), (None, 3)],
    "ghosts": (["e", "f", "g"], [], ["b", "c", "d"], [], 0),
}


def test_arc_reset_clears_ghosts_and_p():
    m = OffloadingManager(2, cache_policy="arc")
    store(m, "ab")
    store(m, "c")  # a -> B1
    m.prepare_store([K("a")], ReqContext("r"))  # a ghost hit: p = 1
    assert m._policy.p == 1 and m._policy.b1
    m.reset_cache()
    assert policy_state(m) == ([], [], [], [], 0)


# --------------------------------------------------------------------------- chunk ids


def scenario_chunk_ids(make) -> dict:
    m = new(make, 4)
    ids = [store(m, "abc", complete=False).store_spec]  # fresh ids, ascending
    m.complete_store(keys_of("ac"), success=False)  # frees 0, then 2
    ids.append(store(m, "xy", complete=False).store_spec)  # fresh 3 first, then the last freed
    ids.append(store(m, "z", complete=False).store_spec)
    return {"ids": ids}


CHUNK_IDS = {"ids": [[0, 1, 2], [3, 2], [0]]}


def test_eviction_frees_victims_chunks_for_the_offer():
    m = OffloadingManager(2)
    store(m, "ab")
    out = store(m, "cd")
    assert names(out.evicted_keys) == ["a", "b"]
    assert out.store_spec == [1, 0]  # victims freed in order, handed out last freed first


# --------------------------------------------------------------------------- failed stores


def scenario_failed_store(make) -> dict:
    m = new(make, 2)
    store(m, "ab", complete=False)
    m.take_events()
    m.complete_store([K("a")], success=False)
    failed = {
        "events": events(m),
        "lookup": m.lookup(K("a")).name,
        "ref": m.ref_count(K("a")),
        "free": m.free_chunks,
    }
    out = store(m, "c", complete=False)
    m.complete_store([K("b")])
    m.take_events()
    m.complete_store(keys_of("bz"), success=False)  # b ready, z absent: both ignored
    m.complete_store(keys_of("bz"))
    return {
        "failed": failed,
        "next": None if out is None else out.store_spec,
        "ignored": (events(m), m.lookup(K("b")).name),
    }


FAILED_STORE = {
    "failed": {"events": [(["a"], True, True)], "lookup": "MISS", "ref": None, "free": 1},
    "next": [0],
    "ignored": ([], "HIT"),
}


# --------------------------------------------------------------------------- residency


def scenario_lookup(make) -> dict:
    m = new(make, 3)
    store(m, "a", complete=False)
    store(m, "b")
    return {n: m.lookup(K(n)) for n in "abc"}


LOOKUP = {"a": LookupResult.HIT_PENDING, "b": LookupResult.HIT, "c": LookupResult.MISS}


def test_loads_pin_and_release():
    m = OffloadingManager(3)
    store(m, "ab")
    assert m.prepare_load(keys_of("ba")) == [1, 0]  # chunk ids in key order
    assert m.prepare_load([K("a")]) == [0]
    assert (m.ref_count(K("a")), m.ref_count(K("b"))) == (2, 1)
    m.complete_load(keys_of("aab"))
    assert (m.ref_count(K("a")), m.ref_count(K("b"))) == (0, 0)


# --------------------------------------------------------------------------- reset


def test_reset_drops_everything_but_tracker_counts():
    m = OffloadingManager(3, store_threshold=2)
    for spec in ("a", "b", "c"):
        fill_in_flight(m, spec, 2)
    m.complete_store(keys_of("ab"))
    m.prepare_load([K("a")])  # a pinned, b idle, c pending
    counts = tracker_items(m)
    assert m.free_chunks == 0
    m.take_events()
    m.reset_cache()
    assert {n: m.lookup(K(n)) for n in "abc"} == dict.fromkeys("abc", LookupResult.MISS)
    assert [m.ref_count(K(n)) for n in "abc"] == [None, None, None]
    assert m.free_chunks == 3 and m.generation == 1
    assert tracker_items(m) == counts
    assert policy_state(m) == []
    s = m.get_stats()
    assert (s.cache_usage, s.write_usage, s.read_usage) == (0, 0, 0)
    m.complete_store([K("c")])  # a pre-reset store is not pending any more: ignored
    assert m.lookup(K("c")) is LookupResult.MISS and events(m) == []
    with pytest.raises(ValueError, match="not pinned"):
        m.complete_load([K("a")])
    assert fill_in_flight(m, "d", 2) == [K("d")]
    assert m.chunk_of(K("d")) == 0  # ids restart at 0


# --------------------------------------------------------------------------- events


def scenario_events(make) -> dict:
    m = new(make, 2)
    out = m.prepare_store(keys_of("ab"), ReqContext("r"))
    at_prepare = events(m)
    m.complete_store(out.keys_to_store)
    at_complete = events(m)
    out = m.prepare_store([K("c")], ReqContext("s"))
    at_eviction = events(m)
    m.complete_store([K("c")])
    return {
        "at_prepare": at_prepare,
        "at_complete": at_complete,
        "at_eviction": at_eviction,
        "last": events(m),
    }


EVENTS = {
    "at_prepare": [],
    "at_complete": [(["a", "b"], False, False)],
    "at_eviction": [(["a"], True, False)],
    "last": [(["c"], False, False)],
}


def test_event_type():
    m = OffloadingManager(1)
    store(m, "a")
    assert m.take_events() == [OffloadingEvent((K("a"),), removed=False)]
    assert m.take_events() == []  # drained


def test_events_replay_to_ready_keys_since_the_last_reset():
    """reset_cache() announces nothing (as upstream's does not): a consumer of the events
    starts its replay over at a reset, and from there the replay gives the ready keys. The
    model documents the same choice; a removal event at reset would make every upstream
    manager diverge from the model."""
    m = OffloadingManager(2)
    store(m, "ab")
    before = m.take_events()
    m.reset_cache()
    assert m.take_events() == []
    store(m, "c")
    replayed: set[bytes] = set()
    for e in m.take_events():
        (replayed.difference_update if e.removed else replayed.update)(e.keys)
    ready = {k for k in keys_of("abc") if m.lookup(k) is LookupResult.HIT}
    assert replayed == ready == {K("c")}
    assert before and not {K("a"), K("b")} & ready


# --------------------------------------------------------------------------- stats


def scenario_stats(make) -> dict:
    m = new(make, 4)
    store(m, "abc", complete=False)
    m.complete_store(keys_of("ab"))
    m.prepare_load([K("a")])  # a pinned, b idle, c pending, one chunk free
    first = m.get_stats().as_dict()
    out = m.prepare_store(keys_of("dea"), ReqContext("r"))  # a resident; d, e: 1 free + b
    m.complete_store(keys_of("de"))
    m.complete_load([K("a")])
    second = m.get_stats().as_dict()
    after_none = m.prepare_store(keys_of("fghij"), ReqContext("s"))  # 5 > 4: None
    return {
        "first": first,
        "out": names(out.evicted_keys),
        "second": second,
        "after_none": (after_none, m.get_stats().as_dict()),
    }


STATS = {
    "first": {
        "vllm:kv_offload_cpu_allocation_size": [3],
        "vllm:kv_offload_cpu_cache_usage_perc": 0.5,
        "vllm:kv_offload_cpu_cache_write_usage_perc": 0.25,
        "vllm:kv_offload_cpu_cache_read_usage_perc": 0.25,
    },
    "out": ["b"],
    "second": {
        "vllm:kv_offload_cpu_allocation_size": [2],
        "vllm:kv_offload_cpu_cache_usage_perc": 0.25,
        "vllm:kv_offload_cpu_cache_write_usage_perc": 0.25,
        "vllm:kv_offload_cpu_cache_read_usage_perc": 0.0,
    },
    "after_none": (
        None,
        {
            "vllm:kv_offload_cpu_allocation_size": [5],
            "vllm:kv_offload_cpu_cache_usage_perc": 0.25,
            "vllm:kv_offload_cpu_cache_write_usage_perc": 0.25,
            "vllm:kv_offload_cpu_cache_read_usage_perc": 0.0,
        },
    ),
}


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Claim:
    """One scenario: what impl must observe, and each variant that breaks the claim with the
    fields in which it must observe something else."""

    name: str
    scenario: Callable[[Any], dict]
    expected: dict
    caught: tuple[tuple[Any, tuple[str, ...]], ...]  # (a MUTANTS name or a factory, fields)


def _at(scenario, T: int):
    return functools.partial(scenario, T=T)


CLAIMS = [
    *(
        Claim(f"a1-T{T}", _at(scenario_a1, T), A1, ((TrackerBelowTwo, ("offers", "skip_metric")),))
        for T in (0, 1)
    ),
    Claim(
        "a2",
        scenario_a2,
        A2,
        (
            ("failed_offer_not_recorded", ("cold_count",)),
            ("every_offer_counts", ("cold_count",)),
            ("every_offer_counts", ("dropped_retracked",)),
            ("dropped_key_not_retracked", ("dropped_retracked",)),
            ("dedup_failed_retries_only", ("cold_count",)),
            ("reoffer_no_refresh", ("refreshed",)),
        ),
    ),
    Claim("a3", scenario_a3, A3, (("records_by_req_id", ("offers",)),)),
    Claim(
        "a4",
        scenario_a4,
        A4,
        (
            ("tracker_evicts_offer_key", ("full_protected",)),
            ("tracker_unbounded", ("full_protected",)),
        ),
    ),
    Claim("a5", scenario_a5, A5, (("skip_metric_every_offer", ("steps",)),)),
    Claim(
        "a5-first-skip",
        scenario_a5_first_skip,
        A5_FIRST_SKIP,
        (("skip_undercount", ("steps",)), ("skip_metric_every_offer", ("steps",))),
    ),
    *(
        Claim(f"a6-T{T}", _at(scenario_a6, T), a6_expected(T), (("strict_threshold", ("stored",)),))
        for T in (2, 3)
    ),
    Claim(
        "a7",
        scenario_a7,
        A7,
        (
            ("reset_keeps_counting", ("after_reoffer",)),
            ("tracker_cleared_on_reset", ("count_after_reset",)),
        ),
    ),
    Claim("a8", scenario_a8, A8, (("partial_eviction_before_none", ("state",)),)),
    Claim("dedup", scenario_dedup, DEDUP, (("repeated_key_stored_twice", ("stored",)),)),
    Claim(
        "lru",
        scenario_lru,
        LRU,
        (("lru_touch_forward", ("evicted",)), ("evicts_pinned", ("evicted2",))),
    ),
    Claim(
        "arc",
        scenario_arc,
        ARC,
        (("arc_ghosts_untrimmed", ("ghosts",)), ("arc_adapts_every_retry", ("p",))),
    ),
    Claim("chunk-ids", scenario_chunk_ids, CHUNK_IDS, (("freed_chunks_fifo", ("ids",)),)),
    Claim(
        "failed-store",
        scenario_failed_store,
        FAILED_STORE,
        (("failed_store_keeps_chunk", ("failed",)),),
    ),
    Claim("lookup", scenario_lookup, LOOKUP, (("lookup_pending_is_hit", ("a",)),)),
    Claim("events", scenario_events, EVENTS, (("store_event_missing", ("at_complete",)),)),
    Claim(
        "stats",
        scenario_stats,
        STATS,
        (("usage_counts_idle", ("first",)), ("no_sample_on_none", ("after_none",))),
    ),
]
CATCHES = [(claim, variant, fields) for claim in CLAIMS for variant, fields in claim.caught]


def _variant_name(variant) -> str:
    return variant if isinstance(variant, str) else variant.__name__


@pytest.mark.parametrize("claim", CLAIMS, ids=[c.name for c in CLAIMS])
def test_impl_observes_what_the_claim_says(claim):
    assert claim.scenario(IMPL) == claim.expected


@pytest.mark.parametrize(
    "claim, variant, fields",
    CATCHES,
    ids=[f"{c.name}-{_variant_name(v)}-{'+'.join(f)}" for c, v, f in CATCHES],
)
def test_the_variant_that_breaks_the_claim_observes_otherwise(claim, variant, fields):
    got = claim.scenario(MUTANTS[variant] if isinstance(variant, str) else variant)
    for field in fields:
        assert got[field] != claim.expected[field], (
            f"the scenario does not catch {_variant_name(variant)} in {field!r}"
        )


def test_stats_skip_metric_only_from_threshold_two():
    assert "vllm:kv_offload_stores_skipped" not in OffloadingManager(2).get_stats().as_dict()
    m = OffloadingManager(2, store_threshold=2)
    assert m.get_stats().as_dict()["vllm:kv_offload_stores_skipped"] == 0
    m.prepare_store([K("a")], ReqContext("r"))
    assert m.get_stats().stores_skipped == 1
    assert m.get_stats().stores_skipped == 0  # since the last call


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_chunks": -1}, "num_chunks"),
        ({"store_threshold": -1}, "store_threshold"),
        ({"max_tracker_size": 0}, "max_tracker_size"),
        ({"cache_policy": "fifo"}, "cache_policy"),
    ],
)
def test_constructor_rejects_out_of_range_arguments(kwargs, name):
    args = {"num_chunks": 4, **kwargs}
    with pytest.raises(ValueError, match=name):
        OffloadingManager(**args)


def test_constructor_accepts_the_edges():
    """The smallest value each argument allows builds a manager that works (spec §8)."""
    empty = OffloadingManager(0, store_threshold=0, max_tracker_size=1)
    assert (empty.num_chunks, empty.free_chunks, empty.tracker) == (0, 0, None)
    # threshold 0 admits at the first offer; no chunk to hold it: None, nothing resident (spec A8)
    assert offer(empty, "a", ReqContext("r")) is None
    assert empty.lookup(K("a")) == LookupResult.MISS
    gauges = empty.get_stats().as_dict()
    assert gauges["vllm:kv_offload_cpu_cache_usage_perc"] == 0.0  # 0 when num_chunks is 0

    one = OffloadingManager(1, cache_policy="arc", store_threshold=2, max_tracker_size=1)
    assert (one.num_chunks, one.free_chunks) == (1, 1) and "p" in one.policy_state()
    # a tracker of one key: b's count pushes a's out, and a second request admits b
    assert offer(one, "a", ReqContext("r1")) == []
    assert offer(one, "b", ReqContext("r1")) == []
    assert tracker_items(one) == [("b", 1)]
    assert offer(one, "b", ReqContext("r2")) == ["b"] and one.free_chunks == 0


ALL = "abcdxz"


def busy_manager(make):
    """T = 2, five chunks: a idle, b pinned, c pending, one free; tracker counts for a-d."""
    m = new(make, 5, T=2)
    for spec in ("a", "b", "c"):
        fill_in_flight(m, spec, 2)
    m.prepare_store([K("d")], ReqContext("d"))  # d counted once
    m.complete_store(keys_of("ab"))
    m.prepare_load([K("b")])
    m.take_events()
    m.get_stats()
    return m


def misuse(m, call: str, args) -> BaseException | None:
    try:
        if call == "prepare_store":
            m.prepare_store(args, ReqContext("r"))
        elif call == "lookup":
            m.lookup(args)
        else:
            getattr(m, call)(args)
    except Exception as exc:  # the test checks the kind
        return exc
    return None


MISUSE = [  # (id, call, arguments, the key the error must name)
    ("load-absent", "prepare_load", [K("a"), K("x")], K("x")),
    ("load-pending", "prepare_load", [K("a"), K("c")], K("c")),
    ("release-idle", "complete_load", [K("b"), K("a")], K("a")),
    ("release-absent", "complete_load", [K("x")], K("x")),
    ("release-pending", "complete_load", [K("c")], K("c")),
    ("release-twice", "complete_load", [K("b"), K("b")], K("b")),  # pinned once
    ("lookup-str", "lookup", "a", "a"),
    ("load-str", "prepare_load", [K("a"), "x"], "x"),
    ("release-int", "complete_load", [K("b"), 7], 7),
    ("touch-bytearray", "touch", [K("a"), bytearray(b"z0000")], bytearray(b"z0000")),
    ("store-none", "prepare_store", [K("d"), K("z"), None], None),  # d would reach 2
    ("complete-str", "complete_store", [K("c"), "x"], "x"),  # c would become ready
]


@pytest.mark.parametrize(
    "call, args, bad", [case[1:] for case in MISUSE], ids=[case[0] for case in MISUSE]
)
def test_misuse_names_the_key_and_changes_nothing(call, args, bad):
    m = busy_manager(IMPL)
    before = snapshot(m, ALL)
    exc = misuse(m, call, args)
    assert isinstance(exc, (TypeError, ValueError)), exc
    assert repr(bad) in str(exc)
    assert snapshot(m, ALL) == before


def test_misuse_catches_load_pins_before_checking():
    m = busy_manager(MUTANTS["load_pins_before_checking"])
    before = snapshot(m, ALL)
    assert misuse(m, "prepare_load", [K("a"), K("x")]) is not None
    assert snapshot(m, ALL) != before
