"""Direct examples of the reference model: the seed's two scenarios, LRU, ARC, reset, choices."""

import pytest

from kvgate.model import Model, ModelError, admission_step

SKIPPED = "vllm:kv_offload_stores_skipped"


def key(name: str) -> bytes:
    return name.encode() + b"\x00\x00\x00\x00"


E, C = key("eligible"), key("cold")


def events(m: Model) -> list:
    """The drained events as (keys, removed, metadata_only)."""
    return [e[:3] for e in m.take_events()]


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
    assert events(m) == [((a, b, c), False, False), ((b,), True, False)]


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
    assert events(m) == [((E,), False, False)]  # queued before the reset, kept; none added


def test_failed_store_frees_last_freed_first_and_errors_leave_state():
    a, b = key("a"), key("b")
    m = Model(2)
    m.prepare_store([a, b], "r")
    m.complete_store([b, a], success=False)
    assert events(m) == [((b, a), True, True)]
    assert m.prepare_store([a], "r") == ([a], [0], [])  # a's chunk 0 was freed last
    with pytest.raises(ModelError, match="pending"):
        m.prepare_load([a])
    with pytest.raises(ModelError, match="not pinned"):
        m.complete_load([a])
    with pytest.raises(ValueError, match="max_tracker_size"):
        Model(1, max_tracker_size=0)


def test_a_foreign_choice_is_applied_as_given():
    """The model judges nothing (the oracle does): ``choose`` is asked only when the offer fits,
    with the admitted keys, the victims needed, the evictable keys and the free ids."""
    a, b, c = key("a"), key("b"), key("c")
    m = Model(2)
    m.prepare_store([a, b], "r")
    m.complete_store([a, b])
    asked = []

    def choose(admitted, need, ok, free):
        asked.append((admitted, need, ok, free))
        return [b], [1]

    assert m.prepare_store([c], "s", choose=choose) == ([c], [1], [b])
    assert asked == [([c], 1, {a, b}, set())]
    assert m.resident[c] == {"chunk": 1, "ref": -1} and m.lru == [a, c]
    assert m.fresh == [] and m.freed == []


def positions(**slots):
    """A request's positions: key name -> end token."""
    table = {key(n): 16 * i for n, i in slots.items()}
    return table.get


def test_request_lru_ranks_a_tail_before_its_head_and_commits_head_most_recent():
    """R4: a request's stores rank at (request rank, -position), so its tail goes first; its
    commit at finish (R3) gives fresh ranks tail first, so the head ends most recent."""
    a, b, c, d = (key(x) for x in "abcd")
    m = Model(3, recency="request")
    pos = positions(a=1, b=2, c=3)
    m.on_new_request("r")
    m.prepare_store([a, b, c], "r", pos)
    assert m.lru == [c, b, a]  # tail (c) least recent while the request runs
    m.complete_store([a, b, c])
    m.on_new_request("s")
    m.prepare_store([a], "s", positions(a=5))  # s sees a: first sight lifts it to s's rank
    assert m.lru == [c, b, a]
    m.on_request_finished("r", pos)  # commit, tail first: c, b, a get fresh ranks
    assert m.lru == [c, b, a] and m.rank[a] > m.rank[b] > m.rank[c]
    assert m.prepare_store([d], "s", positions(d=6)) == ([d], [2], [c])
    assert m.lru == [d, b, a]  # s's rank predates r's commit: its store ranks below it
    m.on_request_finished("r", pos)  # a second finish commits nothing
    assert m.lru == [d, b, a]


def test_request_commit_sorts_only_when_every_key_has_a_position():
    a, b = key("a"), key("b")
    m = Model(2, recency="request")
    m.prepare_store([b, a], "r", positions(a=1))  # b has no position: first-sight order
    m.complete_store([a, b])
    m.on_request_finished("r", positions(a=1))
    assert m.lru == [a, b]  # tail first: a then b; b (seen first) ends most recent


def test_request_arc_promotes_reuse_at_finish_not_stores_or_own_rereads():
    """R5: a ready chunk another request reused moves to T2 when that request finishes; a
    chunk only stored, or re-read by the request that stored it, keeps its list."""
    a, b = key("a"), key("b")
    m = Model(2, policy="arc", recency="request")
    m.prepare_store([a, b], "r")
    m.complete_store([a, b])
    m.prepare_load([a], "r")  # r re-reads its own store: not a reuse
    m.complete_load([a])
    m.prepare_load([b], "s")  # s reuses b
    m.complete_load([b])
    assert m.t1 == [a, b] and m.t2 == []  # nothing moves before the finishes
    m.on_request_finished("r")
    assert m.t1 == [b, a]  # insertion only: a refreshed at T1's recent end, head last
    m.on_request_finished("s")
    assert m.t1 == [a] and m.t2 == [b]


def test_request_arc_evicts_against_floor_p_and_moves_ghosts_on_a_hit():
    """R6: |T1| is compared with floor(p); a ghost hit moves the ghost to its recent end."""
    m = Model(3, policy="arc", recency="request")
    a, b, c = key("a"), key("b"), key("c")
    m.b1, m.b2, m.p = [a, b], [c], 0.0
    m._adapt(a)
    assert m.p == 1.0 and m.b1 == [b, a]
    m.p = 1.5
    t = Model(3, policy="arc")  # the touch-based rules compare with p itself
    for model in (m, t):
        model.resident = {k: {"chunk": i, "ref": 0} for i, k in enumerate((a, b))}
        model.t1, model.t2, model.p = [a], [b], 1.5
    assert m._victims(1, {a, b}) == [a]  # 1 >= floor(1.5): from T1
    assert t._victims(1, {a, b}) == [b]  # 1 < 1.5: from T2


def test_events_switched_off_and_the_interface_answers():
    a = key("a")
    m = Model(1, enable_events=False)
    assert m.on_new_request("r") == "chunk_level"
    m.prepare_store([a], "r")
    m.complete_store([a])
    assert events(m) == []
    assert m.get_load_source(a) == "host" and m.config_info() == [{}]
    assert m.has_pending_work() is False
    with pytest.raises(ModelError, match="not a hit"):
        m.get_load_source(key("b"))


def test_two_models_share_one_record_per_request():
    """A context holds one record per type: a manager that takes it replaces the other's."""
    slots: dict = {}
    m1, m2 = Model(2, store_threshold=2, slots=slots), Model(2, store_threshold=2, slots=slots)
    a = key("a")
    m1.prepare_store([a], "r")
    m2.on_new_request("r")  # m2 takes r's record
    m1.prepare_store([a], "r")  # so r's offer counts again in m1: a new record
    assert dict(m1.tracker_items())[a] == 2
