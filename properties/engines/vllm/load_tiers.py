"""The tiers a request may load from, as the connector tells its manager (issue 30, item 2).

A request names them in its ``kv_transfer_params`` under ``kv_load_tiers``: a list of entries,
each naming a medium (``cpu``, ``storage``), a locality (``local``, ``remote``) or both, any
case; an entry leaves out what it does not name. The connector hands the manager a context
whose ``load_tier_filter`` allows a tier exactly when some well-formed entry names it. Entries
that are not a mapping or name a medium or locality the release does not know are skipped;
what a list with no well-formed entry means (every tier, or none) is the release's fallback,
and is not judged here.

Its known-bad connector is planted by properties/engines/vllm/faults.py, with the others.
"""

from __future__ import annotations

from typing import Any

LOAD_TIERS = "kv_load_tiers"  # the key of kv_transfer_params
# What a machine's request with max_load='cpu' names: the local CPU tier, beside an entry for
# a medium no release knows (skipped); with 'cpu-last', entries a release skips first (an
# unknown medium, an unknown locality): a skipped entry must not end its reading of the list.
LOAD_FROM_CPU = ({"medium": "cpu", "locality": "local"}, {"medium": "tape"})
TIER_LISTS = {
    "cpu": LOAD_FROM_CPU,
    "cpu-last": ({"medium": "tape"}, {"medium": "cpu", "locality": "orbit"}, LOAD_FROM_CPU[0]),
}


def _named(entry: dict, field: str, kinds: Any) -> Any:
    """The member of ``kinds`` an entry names for ``field``; None where it names none;
    ``False`` where it names one the release does not know."""
    raw = entry.get(field)
    if raw is None:
        return None
    return next((k for k in kinds if isinstance(raw, str) and raw.upper() == k.value), False)


def _tiers(allows: Any) -> set[tuple[Any, Any]]:
    """Every (medium, locality) pair the release knows for which ``allows(medium, locality)``."""
    from vllm.v1.kv_offload.base import Locality, Medium

    return {(m, loc) for m in Medium for loc in Locality if allows(m, loc)}


def allowed(asked: Any) -> set[tuple[Any, Any]] | None:
    """The (medium, locality) pairs a request's ``kv_load_tiers`` allows; None where the
    request names no well-formed entry (nothing to judge)."""
    from vllm.v1.kv_offload.base import Locality, Medium

    if not isinstance(asked, list):
        return None
    entries = []
    for entry in asked:
        if not isinstance(entry, dict):
            continue
        medium = _named(entry, "medium", Medium)
        locality = _named(entry, "locality", Locality)
        if medium is not False and locality is not False:
            entries.append((medium, locality))
    if not entries:
        return None
    return _tiers(lambda m, loc: any(em in (None, m) and el in (None, loc) for em, el in entries))


def told(ctx: Any, params: dict | None) -> str | None:
    """What is wrong with the tiers the manager's context allows a request whose client sent
    ``params`` as its ``kv_transfer_params``; None if nothing (or the release's context
    carries no tier filter)."""
    if not hasattr(ctx, "load_tier_filter"):
        return None
    chosen = ctx.load_tier_filter
    if not hasattr(chosen, "allows"):  # an unset filter: no tier's answer can be read from it
        return (
            f"the manager's context of {ctx.req_id} carries no tier filter ({chosen!r}); "
            f"the request's {LOAD_TIERS} is {(params or {}).get(LOAD_TIERS)!r}"
        )
    asked = (params or {}).get(LOAD_TIERS)
    want = allowed(asked)
    if want is None:
        return None
    got = _tiers(chosen.allows)
    if got == want:
        return None

    def names(pairs: set) -> str:
        return ", ".join(sorted(f"{m.value.lower()}/{loc.value.lower()}" for m, loc in pairs))

    return (
        f"the manager's context of {ctx.req_id} lets it load from {names(got) or 'no tier'}; "
        f"the request's {LOAD_TIERS} {asked!r} names {names(want)}"
    )
