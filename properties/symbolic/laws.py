"""Laws over a few offers in a row (spec §3: A2, A3, A7), as contracts for CrossHair. A key is an
index into ``KEYS``, a record a bit mask over them: CrossHair branches on small numbers, not on
symbolic bytes. Nothing is resident."""

from __future__ import annotations

from kvgate.model.admission import admission_step

KEYS = (b"a", b"b", b"c")
Pairs = tuple[tuple[int, int], ...]  # (key, count), least recent first


def ok(pairs: Pairs, offer: tuple[int, ...], t: int, size: int) -> bool:
    """A state the step's ``pre:`` allows, with 3 keys and a tracker of 3 at most."""
    return (
        0 <= t <= 3
        and 1 <= size <= 3
        and len(pairs) <= size
        and (t >= 2 or not pairs)
        and len({i for i, _ in pairs}) == len(pairs)
        and len(offer) <= 3
        and all(0 <= i < 3 for i in offer)
        and all(0 <= i < 3 and n >= 1 for i, n in pairs)
    )


def step(tracker, record, offer: tuple[int, ...], t: int, size: int):
    """One offer by the request whose record is ``record``: (tracker, record)."""
    keys = tuple(KEYS[i] for i in offer)
    return admission_step(tracker, record, frozenset(), keys, frozenset(), t, size)[:2]


def reoffer(pairs: Pairs, mask: int, offer: tuple[int, ...], t: int, size: int):
    """Spec A2: a request offers the same keys twice (a retry, a resumed request). Returns (record,
    tracker before, after, after the re-offer): the re-offer changes no count, and a key that
    enters the tracker enters with count 1, also one the request counted before the tracker
    dropped it (spec A2), so one request never takes a key from 0 to 2.

    pre: ok(pairs, offer, t, size) and 0 <= mask < 8
    post: dict(__return__[3]) == dict(__return__[2])
    post: all(n == 1 for k, n in __return__[2] if k not in dict(__return__[1]))
    """
    record = frozenset(k for i, k in enumerate(KEYS) if mask >> i & 1)
    before = tuple((KEYS[i], n) for i, n in pairs)
    first, again = step(before, record, offer, t, size)
    return record, before, first, step(first, again, offer, t, size)[0]


def after_reset(pairs: Pairs, mask: int, offer: tuple[int, ...], t: int, size: int):
    """Spec A7: a request offers; a reset starts its record over (counts survive); it offers again:
    each offered key the tracker holds counts again. Returns (tracker, tracker after, offer).

    pre: ok(pairs, offer, t, size) and 0 <= mask < 8 and t >= 2
    post: all(dict(__return__[1])[k] == n + 1 for k, n in __return__[0] if k in __return__[2])
    """
    record = frozenset(k for i, k in enumerate(KEYS) if mask >> i & 1)
    first = step(tuple((KEYS[i], n) for i, n in pairs), record, offer, t, size)[0]
    return first, step(first, frozenset(), offer, t, size)[0], {KEYS[i] for i in offer}


def offers_from_requests(offers: list[tuple[int, tuple[int, ...]]], t: int, size: int):
    """Spec A2/A3: requests (one context per id) offer in turn from an empty tracker. Returns the
    tracker and, per key, the requests that offered it since it last entered.

    pre: 2 <= t <= 3 and 1 <= size <= 3 and len(offers) <= 4
    pre: all(ok((), offer, t, size) and len(offer) <= 2 for _, offer in offers)
    post: all(1 <= n <= len(__return__[1][k]) for k, n in __return__[0])
    """
    tracker: tuple[tuple[bytes, int], ...] = ()
    records: dict[int, frozenset[bytes]] = {}
    offerers: dict[bytes, set[int]] = {}
    for req, offer in offers:
        before = dict(tracker)
        tracker, records[req] = step(tracker, records.get(req, frozenset()), offer, t, size)
        for k, _ in tracker:  # a key that entered now counts its requests from here on
            offerers[k] = (offerers[k] if k in before else set()) | (
                {req} if KEYS.index(k) in offer else set()
            )
    return tracker, offerers
