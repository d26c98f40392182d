"""Request-scoped recency (spec R1-R7) in impl's manager, by example: each scenario holds on
``OffloadingManager(recency="request")`` and fails on the catalogued variant that breaks its rule
(the machines find those variants too; these examples say what each rule means). A scenario's
decisive assertion carries a message that starts with the rules its docstring starts with, so a
variant is caught by that assertion, not by a setup step that went wrong first."""

from __future__ import annotations

import re

import pytest

from kvgate.impl.base import ReqContext, make_key
from kvgate.impl.manager import OffloadingManager
from kvgate.properties.catalogue import managers as mutants

A, B, C, D = (make_key(x.encode()) for x in "ABCD")


def ctx(name: str, **slots: int) -> ReqContext:
    """A request whose keys end at the given 16-token slots."""
    c = ReqContext(name)
    for key_name, slot in slots.items():
        c.set_offload_key_position(make_key(key_name.encode()), 16 * slot)
    return c


def build(cls, n: int, policy: str = "lru") -> OffloadingManager:
    return cls(n, cache_policy=policy, recency="request")


def stored(m, c, keys):
    out = m.prepare_store(keys, c)
    m.complete_store(out.keys_to_store, c)
    return out


def tail_goes_before_head(cls):
    """R4: while a request runs, its tail is evicted before its head."""
    m = build(cls, 2)
    r = ctx("r", A=1, B=2)
    stored(m, r, [A, B])
    assert m.prepare_store([C], ctx("s")).evicted_keys == [B], "R4: the tail B goes first"


def head_ends_most_recent(cls):
    """R3: at finish the keys are committed tail first, so the head ends most recent."""
    m = build(cls, 3)
    r = ctx("r", A=1, B=2)
    stored(m, r, [A, B])
    stored(m, ctx("s", C=1), [C])
    m.on_request_finished(r)
    assert m.policy_state()["lru"] == [C, B, A], "R3: the head A ends most recent"


def commit_follows_positions(cls):
    """R3: the commit orders the keys by position, not by when the request first saw them."""
    m = build(cls, 2)
    r = ctx("r", A=2, B=1)
    stored(m, r, [A, B])
    m.on_request_finished(r)
    assert m.policy_state()["lru"] == [A, B], "R3: B, at the lower position, ends most recent"


def stale_record_commits_nothing(cls):
    """R3: a request that finishes after a reset commits nothing of what it did before."""
    m = build(cls, 2)
    r = ctx("r", A=1)
    stored(m, r, [A])
    m.reset_cache()
    stored(m, ctx("s", A=1), [A])  # another request stores A again
    stored(m, ctx("t", B=1), [B])
    m.on_request_finished(r)
    assert m.policy_state()["lru"] == [A, B], "R3: the stale record moved nothing"


def first_sight_lifts_a_rank(cls):
    """R2, R4: a request's first sight of a resident key lifts it to that request's rank."""
    m = build(cls, 2)
    old = ctx("old", A=1)
    stored(m, old, [A])
    m.on_request_finished(old)
    stored(m, ctx("mid", B=1), [B])
    new = ctx("new", A=1)
    m.prepare_load([A], new)
    m.complete_load([A], new)
    assert m.policy_state()["lru"] == [B, A], "R2, R4: A lifted above B"


def first_sight_never_lowers(cls):
    """R4: first sight keeps the larger rank: an older request's access does not age a key."""
    m = build(cls, 3)
    old = ctx("old", A=1)
    m.on_new_request(old)
    m.prepare_store([C], old)  # old takes its rank now
    young = ctx("young", A=1, B=2)
    stored(m, young, [A, B])
    m.on_request_finished(young)  # A, B get fresh ranks, newer than old's
    m.prepare_load([A], old)  # old sees A: its rank is older, A keeps its own
    m.complete_load([A], old)
    assert m.policy_state()["lru"][-2:] == [B, A], "R4: A kept its own rank"


def store_is_not_reuse(cls):
    """R5: a chunk a request only stored keeps its ARC list at finish."""
    m = build(cls, 2, "arc")
    r = ctx("r")
    stored(m, r, [A])
    m.on_request_finished(r)
    assert m.policy_state()["t2"] == [], "R5: A, only stored, stays out of T2"


def own_reread_is_not_reuse(cls):
    """R1: re-reading a chunk the request stored itself is not a reuse."""
    m = build(cls, 2, "arc")
    r = ctx("r")
    stored(m, r, [A])
    m.prepare_load([A], r)
    m.complete_load([A], r)
    m.on_request_finished(r)
    assert m.policy_state()["t2"] == [], "R1: A, reread by its writer, stays out of T2"


def pending_is_not_reuse(cls):
    """R1: offering a key whose store is in flight does not make it a reuse."""
    m = build(cls, 2, "arc")
    m.prepare_store([A], ctx("writer"))
    r = ctx("r")
    m.prepare_store([A], r)  # pending: neither a candidate nor a reuse
    m.complete_store([A], r)
    m.on_request_finished(r)
    assert m.policy_state()["t2"] == [], "R1: A, pending when offered, stays out of T2"


def reuse_promotes_at_finish(cls):
    """R5: a ready chunk another request loaded moves to T2 when that request finishes."""
    m = build(cls, 2, "arc")
    stored(m, ctx("writer"), [A])
    r = ctx("r")
    m.prepare_load([A], r)
    m.complete_load([A], r)
    assert m.policy_state()["t2"] == []
    m.on_request_finished(r)
    assert m.policy_state()["t2"] == [A], "R5: A, loaded by another request, moved to T2"


def ghost_hit_moves_the_ghost(cls):
    """R6: a ghost hit moves the ghost to its list's recent end (here the offer then finds no
    room, so the ghost stays a ghost)."""
    m = build(cls, 2, "arc")
    stored(m, ctx("w"), [A, B])
    stored(m, ctx("x"), [C, D])  # A and B are evicted to B1, in that order
    assert m.policy_state()["b1"] == [A, B]
    m.prepare_load([C, D], ctx("y"))  # nothing evictable now
    assert m.prepare_store([A], ctx("z")) is None
    assert m.policy_state()["b1"] == [B, A], "R6: the ghost A moved to B1's recent end"


def floor_of_p(cls):
    """R6: |T1| is compared with floor(p) when choosing the list to evict from."""
    m = build(cls, 3, "arc")
    stored(m, ctx("w"), [A, B])
    policy = m._policy
    policy.t2[B] = policy.t1.pop(B)  # A in T1, B in T2
    policy.p = 1.5
    evicted = m.prepare_store([C, D], ctx("x")).evicted_keys
    assert evicted == [A], "R6: |T1| = 1 >= floor(p) = 1: T1's A goes"


SCENARIOS = {
    "tail_goes_before_head": (tail_goes_before_head, "insert_ignores_position"),
    "head_ends_most_recent": (head_ends_most_recent, "commit_head_first"),
    "commit_follows_positions": (commit_follows_positions, "commit_ignores_positions"),
    "stale_record_commits_nothing": (stale_record_commits_nothing, "commits_stale_record"),
    "first_sight_lifts_a_rank": (first_sight_lifts_a_rank, "no_first_sight"),
    "first_sight_never_lowers": (first_sight_never_lowers, "first_sight_lowers_rank"),
    "store_is_not_reuse": (store_is_not_reuse, "arc_insert_promotes"),
    "own_reread_is_not_reuse": (own_reread_is_not_reuse, "self_reread_is_reuse"),
    "pending_is_not_reuse": (pending_is_not_reuse, "pending_offer_is_reuse"),
    "reuse_promotes_at_finish": (reuse_promotes_at_finish, "no_commit"),
    "ghost_hit_moves_the_ghost": (ghost_hit_moves_the_ghost, "arc_ghost_stays"),
    "floor_of_p": (floor_of_p, mutants.ArcFractionalTarget),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rule_holds_on_impl(name):
    SCENARIOS[name][0](OffloadingManager)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_rule_fails_on_its_variant(name):
    scenario, variant = SCENARIOS[name]
    cls = variant if isinstance(variant, type) else mutants.MUTANTS[variant].cls
    rule = scenario.__doc__.split(":")[0]  # "R4", "R2, R4": the decisive assertion says it first
    with pytest.raises(AssertionError, match=rf"^{re.escape(rule)}: "):
        scenario(cls)
