"""The admission rule (spec §3, A1-A6) as one pure function.

How it works and why: docs/internals.md, section model/admission.py.
"""

from __future__ import annotations

Tracker = tuple[tuple[bytes, int], ...]  # (key, count), least recent first


def admission_step(
    tracker: Tracker,
    counted: frozenset[bytes],
    skipped: frozenset[bytes],
    offer: tuple[bytes, ...],
    resident: frozenset[bytes],
    threshold: int,
    max_tracker_size: int,
    count: bool = True,
) -> tuple[Tracker, frozenset[bytes], frozenset[bytes], tuple[bytes, ...], int]:
    """Record one offer; return (tracker, counted, skipped, admitted, new_skips).
    ``count=False``: the offer counts nothing (a tracker fed at lookups), tracker and
    ``counted`` come back as they were.

    ``counted``/``skipped``: the keys this request counted/was skipped on in this generation.
    ``resident``: ready or pending keys (never candidates). The last five ``post:``: spec A6;
    spec A1 (nothing filtered or tracked below 2); spec A2/A7 (an offered tracked key gains one iff this
    request has not counted it in this generation); spec A2 (an offered key the tracker did not
    hold has count 1 after the offer, whether or not this request counted it before, unless the
    tracker is full of the offer's own keys).
    Laws over several offers: ``properties/symbolic/laws.py``.

    pre: threshold >= 0 and max_tracker_size >= 1 and (threshold >= 2 or not tracker)
    pre: len(tracker) <= max_tracker_size and len(dict(tracker)) == len(tracker)
    pre: count
    post: set(__return__[3]) <= set(offer) - resident
    post: len(set(__return__[3])) == len(__return__[3])
    post: len(__return__[0]) <= max_tracker_size
    post: counted <= __return__[1] and skipped <= __return__[2]
    post: __return__[4] == len(__return__[2] - skipped)
    post: threshold < 2 or all(dict(__return__[0])[k] >= threshold for k in __return__[3])
    post: threshold >= 2 or __return__[:3] + __return__[4:] == (tracker, counted, skipped, 0)
    post: threshold >= 2 or set(__return__[3]) == set(offer) - resident
    post: all(dict(__return__[0])[k] - n == (k not in counted) for k, n in tracker if k in offer)
    post: threshold < 2 or all(dict(__return__[0]).get(k) == 1 or (len(__return__[0]) == max_tracker_size and all(o in offer for o, _ in __return__[0])) for k in offer if k not in dict(tracker))
    """
    offer = tuple(dict.fromkeys(offer))  # a repeated key is one offer of it
    candidates = [k for k in offer if k not in resident]
    if threshold < 2:  # spec A1
        return tracker, counted, skipped, tuple(candidates), 0
    counts = dict(tracker)  # insertion order = recency order, least recent first
    if not count:  # fed at lookups (spec §3.2): filter and skip only
        low = frozenset(k for k in candidates if counts.get(k, 0) < threshold)  # spec A5
        new = low - skipped
        admitted = tuple(k for k in candidates if k not in low)  # spec A6
        return tracker, counted, skipped | new, admitted, len(new)
    for k in offer:  # spec A2/A4: the offer's tracked keys are refreshed first, in offer order
        if k in counts:
            n = counts.pop(k)
            counts[k] = n if k in counted else n + 1
    for k in offer:  # then its untracked keys enter with count 1, in offer order (spec A2, A4)
        if k in counts:
            continue
        if len(counts) >= max_tracker_size:
            oldest = next((o for o in counts if o not in offer), None)
            if oldest is None:  # every tracked key is protected: k is not tracked
                continue
            del counts[oldest]
        counts[k] = 1
    low = frozenset(k for k in candidates if counts.get(k, 0) < threshold)  # spec A5
    admitted = tuple(k for k in candidates if k not in low)  # spec A6
    new = low - skipped
    return tuple(counts.items()), counted | frozenset(offer), skipped | new, admitted, len(new)
