"""Direct examples of the reference model: the seed's two scenarios, LRU, ARC, reset, choices."""
import pytest

from kvgate.model import Model, ModelError, admission_step
from kvgate.model.cache import AdmissionDiffers

SKIPPED = "vllm:kv_offload_stores_skipped"


def key(name: str) -> bytes:
    return name.encode() + b"\x00\x00\x00\x00"


E, C = key("eligible"), key("cold")


def count(m: Model, k: bytes) -> int:
    return dict(m.tracker_items()).get(k, 0)


def fill(m: Model, T: int, names) -> list:
    """Admit keys of other requests (each offered by T requests) and leave their stores in
    flight."""
    keys = [key(n) for n in names]
    for r in range(T - 1):
        assert m.prepare_store(keys, f"fill{r}") == ([], [], [])
    assert m.prepare_store(keys, "fill")[0] == keys
    for r in range(T - 1):  # E is counted T - 1 times by other requests
        assert m.prepare_store([E], f"warm{r}") is not None
    m.get_stats()
    return keys


@pytest.mark.parametrize("T", [2, 3])
@pytest.mark.parametrize("n", [1, 2])
def test_retry_of_a_failed_offer_does_not_count(T, n):
    m = Model(n, store_threshold=T)
    filler = fill(m, T, [f"f{i}" for i in range(n)])
    assert m.lookup(E) == "MISS"
    assert m.prepare_store([E, C], "req") is None
    assert m.prepare_store([E, C], "req") is None  # the retry
    m.complete_store(filler)
    keys, ids, evicted = m.prepare_store([E, C], "req")
    assert keys == [E] and len(ids) == 1 and len(evicted) == 1
    assert count(m, C) == 1 and count(m, E) == T
    assert m.get_stats()[SKIPPED] == 1


@pytest.mark.parametrize("T", [2, 3])
def test_re_offer_after_preemption_does_not_count(T):
    m = Model(2, store_threshold=T)
    for r in range(T - 1):
        m.prepare_store([E], f"warm{r}")
    m.get_stats()
    assert m.prepare_store([E, C], "req") == ([E], [0], [])
    m.complete_store([E])
    assert m.prepare_store([E, C], "req") == ([], [], [])  # resumed: same request, same keys
    assert count(m, C) == 1 and m.lookup(C) == "MISS"
    assert m.get_stats()[SKIPPED] == 1
    out = m.prepare_store([C], "other")  # another request still counts it
    assert count(m, C) == 2
    assert out == (([C], [1], []) if T == 2 else ([], [], []))


def test_below_threshold_two_everything_absent_is_admitted():
    m = Model(4)
    assert m.prepare_store([E, C, E], "r") == ([E, C], [0, 1], [])
    assert m.tracker_items() == [] and SKIPPED not in m.get_stats()


def test_full_tracker_protects_the_offer():
    a, b, c = key("a"), key("b"), key("c")
    tracker = ((a, 1), (b, 1))
    out = admission_step(tracker, frozenset(), frozenset(), (b, c), frozenset(), 2, 2)
    assert out[0] == ((b, 2), (c, 1))  # a (not offered) is pushed out, b refreshed first
    out = admission_step(out[0], frozenset(), frozenset(), (b, c, a), frozenset(), 2, 2)
    assert out[0] == ((b, 3), (c, 2)) and a in out[1]  # a cannot enter, yet it was counted
    assert out[3] == (b, c) and out[4] == 1


def test_lru_evicts_least_recent_and_touch_makes_first_key_most_recent():
    a, b, c, d = (key(x) for x in "abcd")
    m = Model(3)
    m.prepare_store([a, b, c], "r")
    m.complete_store([a, b, c])
    m.touch([a, b])  # order now c, b, a (a most recent)
    assert m.lru == [c, b, a]
    m.prepare_load([c])  # pinned: not evictable
    assert m.prepare_store([d], "s") == ([d], [1], [b])
    assert m.take_events() == [((a, b, c), False, False), ((b,), True, False)]


def test_arc_ghost_hit_adapts_once_per_request():
    a, b, c = key("a"), key("b"), key("c")
    m = Model(2, policy="arc")
    m.prepare_store([a, b], "r")
    m.complete_store([a, b])
    assert m.prepare_store([c], "r") == ([c], [0], [a])  # |T1| = 2 >= p = 0: from T1
    assert m.b1 == [a] and m.t1 == [b, c]
    m.prepare_load([b])  # b pinned, c pending: nothing evictable
    assert m.prepare_store([a], "x") is None and m.p == 1.0  # a is a ghost in B1
    assert m.prepare_store([a], "x") is None and m.p == 1.0  # the retry does not adapt again
    assert m.prepare_store([a], "y") is None and m.p == 2.0  # another request does
    m.touch([a])
    assert m.p == 2.0  # capped at capacity
    m.complete_load([b])
    m.complete_store([c])
    m.touch([b])  # ready in T1 -> T2
    assert m.t1 == [c] and m.t2 == [b]
    assert m.prepare_store([a], "z") == ([a], [1], [b])  # |T1| = 1 < p = 2: from T2
    assert m.b2 == [b] and m.b1 == [] and m.t1 == [c, a]


def test_reset_drops_chunks_keeps_counts_and_starts_counting_over():
    m = Model(2, store_threshold=2)
    m.prepare_store([E], "w")
    m.prepare_store([E, C], "r")
    m.complete_store([E])
    m.prepare_load([E])
    m.reset_cache()
    assert m.lookup(E) == "MISS" and m.generation == 1 and m.counted("r") == set()
    assert count(m, E) == 2 and count(m, C) == 1
    assert m.get_stats()[SKIPPED] == 2  # w skipped E, r skipped C
    assert m.prepare_store([E, C], "r") == ([E, C], [0, 1], [])  # r counts C again: 2
    assert m.get_stats()["vllm:kv_offload_cpu_cache_write_usage_perc"] == 1.0
    assert m.take_events() == [((E,), False, False)]  # queued before the reset, kept; none added


def test_failed_store_frees_last_freed_first_and_errors_leave_state():
    a, b = key("a"), key("b")
    m = Model(2)
    m.prepare_store([a, b], "r")
    m.complete_store([b, a], success=False)
    assert m.take_events() == [((b, a), True, True)]
    assert m.prepare_store([a], "r") == ([a], [0], [])  # a's chunk 0 was freed last
    with pytest.raises(ModelError, match="pending"):
        m.prepare_load([a])
    with pytest.raises(ModelError, match="not pinned"):
        m.complete_load([a])
    with pytest.raises(ValueError, match="max_tracker_size"):
        Model(1, max_tracker_size=0)


def test_foreign_choice_is_checked_then_adopted():
    a, b, c = key("a"), key("b"), key("c")
    m = Model(2)
    m.prepare_store([a, b], "r")
    m.complete_store([a, b])
    with pytest.raises(ModelError, match="illegal eviction"):
        m.prepare_store([c], "s", choice=([c], [0]))
    with pytest.raises(ModelError, match="illegal chunk ids"):
        m.prepare_store([c], "s", choice=([b], [0]))
    assert m.prepare_store([c], "s", choice=([b], [1])) == ([c], [1], [b])
    assert m.resident[c] == {"chunk": 1, "ref": -1} and m.lru == [a, c]
    assert m.fresh == [] and m.freed == []


def test_foreign_admission_is_compared_before_the_choice():
    """A foreign target that stores other keys than the model admits is told so, rather than
    that its chunk ids are illegal (they are, for the model's admission)."""
    a = key("a")
    m = Model(2, store_threshold=2)
    with pytest.raises(AdmissionDiffers) as info:
        m.prepare_store([a], "r", choice=([], [0]), stored=[a])
    assert info.value.admitted == [] and "the model admits []" in str(info.value)
    assert m.prepare_store([a], "s", choice=([], [0]), stored=[a]) == ([a], [0], [])
