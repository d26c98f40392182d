"""What each call of a manager interface may answer, checked before kvgate's own code reads the
answer: one that breaks the interface's types or documented shapes is a ``BadAnswer``, the
target's divergence (spec §9), never an exception inside kvgate.

Every adapter sends each answer it reads through one of the checks below (``prepare_load``'s
spec, ``prepare_store``'s output and its three fields, a lookup, events, stats, the interface
answers), with the words of the interface it speaks: "a LoadStoreSpec with block_ids" for
vLLM's, "a list of chunk ids" for kvgate's. ``None`` passes only where the interface documents
it: ``prepare_store`` (the offer cannot be stored), ``get_stats`` ("None if disabled": the
oracle judges when that is allowed, spec §5.3) and a lookup of a release whose lookup is
declared to answer a bool or ``None``. The calls whose answer kvgate never reads
(``complete_load``, ``complete_store``, ``touch``, ``reset_cache``, ``on_request_finished``)
are not judged on it.

``LEDGER`` keeps the first ill-formed answer of the example that runs now (the runner starts it
afresh per example): an exception raised in kvgate's code after an ill-formed answer is blamed
on that answer (a verdict, exit 1), never on kvgate (``properties.runner``, the oracle).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

# What a call's answer must be, in the words of each interface (vLLM's, kvgate's own).
VLLM = {
    "spec": "a LoadStoreSpec with block_ids (chunk ids, integers)",
    "store": "None or a PrepareStoreOutput(keys_to_store, store_spec, evicted_keys)",
    "keys": "a list of offload keys",
    "lookup": "a LookupResult (MISS, HIT, HIT_PENDING or RETRY)",
    "lookup_bool": "True, False or None (its lookup is declared to answer a bool)",
    "events": "an iterable of OffloadingEvents (each with keys and removed)",
    "stats": "None (if disabled) or an OffloadingConnectorStats whose reduce() gives a "
    "metric-name -> value mapping",
    "config_info": "a sequence of mappings (label -> str, int, float or bool)",
    "has_pending_work": "a bool",
    "load_source": "a CacheHitSource",
    "new_request": "a RequestOffloadingContext with a policy",
}
NATIVE = dict(
    VLLM,
    spec="a list of chunk ids (integers)",
    store="None or a PrepareStoreOutput(keys_to_store, store_spec, evicted_keys)",
    keys="a list of keys",
    lookup="a LookupResult (MISS, HIT or HIT_PENDING)",
    events="an iterable of OffloadingEvents (each with keys and removed)",
    stats="None or a stats object with as_dict(), or a metric-name -> value mapping",
    load_source="the tier's name (a str)",
    new_request="an offloading policy (a str)",
)


class BadAnswer(Exception):
    """The target answered a call with something its interface does not allow (``None`` where
    a ``LookupResult`` is due): a divergence of the target's, raised by the adapter before
    kvgate reads the answer."""


class Ledger:
    """The first ill-formed answer of the example running now (``""``: none yet)."""

    def __init__(self) -> None:
        self.first = ""

    def reset(self) -> None:
        self.first = ""

    def record(self, message: str) -> None:
        if not self.first:
            self.first = message


LEDGER = Ledger()


def shown(value: Any, limit: int = 80) -> str:
    """An answer as a divergence shows it: its repr, cut to ``limit`` characters."""
    text = repr(value.tolist()) if hasattr(value, "tolist") else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def bad(call: str, answered: str, requires: str) -> BadAnswer:
    """The ``BadAnswer`` for ``call`` (recorded in ``LEDGER``, even if someone swallows it)."""
    message = f"{call} answered {answered}; the interface requires {requires}"
    LEDGER.record(message)
    return BadAnswer(message)


def is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _sequence(value: Any) -> list | None:
    """``value`` as a list where it is a finite sequence of items (not text, not a mapping)."""
    if value is None or isinstance(value, (str, bytes, Mapping)):
        return None
    try:
        return list(value)
    except TypeError:
        return None


def chunk_ids(call: str, ids: Any, requires: str, whose: str = "") -> list:
    """``ids`` (a spec's ``block_ids``, or a plain list) as a list of integers; ``whose``:
    what the ids belong to, for the message ("a PrepareStoreOutput whose store_spec")."""
    items = _sequence(ids)
    if items is None or not all(is_integer(i) for i in items):
        head = f"{whose} " if whose else ""
        raise bad(call, f"{head}{shown(ids)}".strip(), requires)
    return items


def spec_block_ids(call: str, spec: Any, requires: str, whose: str = "") -> list:
    """A vLLM load/store spec's ``block_ids``, checked: a spec must have them. ``whose``: what
    the spec belongs to ("a PrepareStoreOutput whose store_spec")."""
    if not hasattr(spec, "block_ids"):
        raise bad(call, f"{whose} is {shown(spec)}" if whose else shown(spec), requires)
    label = f"{whose} has block_ids" if whose else "a spec whose block_ids are"
    return chunk_ids(call, spec.block_ids, requires, label)


def keys(call: str, value: Any, requires: str, whose: str) -> list:
    """A list of keys (``keys_to_store``, ``evicted_keys``, an event's ``keys``)."""
    items = _sequence(value)
    if items is None:
        raise bad(call, f"{whose} {shown(value)}", requires)
    return items


def store_output(call: str, out: Any, words: dict[str, str], vllm: bool) -> tuple | None:
    """``prepare_store``'s answer: ``None``, or its three fields checked (keys to store, the
    chunk ids, evicted keys) as ``(keys, spec, evicted)``, the spec still as answered."""
    if out is None:
        return None
    fields = ("keys_to_store", "store_spec", "evicted_keys")
    if not all(hasattr(out, f) for f in fields):
        raise bad(call, shown(out), words["store"])
    name = type(out).__name__
    stored = keys(call, out.keys_to_store, words["keys"], f"a {name} whose keys_to_store is")
    evicted = keys(call, out.evicted_keys, words["keys"], f"a {name} whose evicted_keys is")
    whose = f"a {name} whose store_spec"
    if vllm:
        spec_block_ids(call, out.store_spec, words["spec"], whose)
    else:
        chunk_ids(call, out.store_spec, words["spec"], f"{whose} is")
    return stored, out.store_spec, evicted


def events(call: str, answer: Any, requires: str) -> list:
    """``take_events``'s answer drained into a list; each event has keys and ``removed``."""
    items = _sequence(answer)
    if items is None:
        raise bad(call, shown(answer), requires)
    for event in items:
        if not hasattr(event, "keys") or not hasattr(event, "removed"):
            raise bad(call, f"an event {shown(event)}", requires)
        keys(call, event.keys, requires, "an event whose keys are")
        if not isinstance(event.removed, (bool, numbers.Integral)):
            raise bad(call, f"an event whose removed is {shown(event.removed)}", requires)
    return items


def metrics(call: str, raw: Any, requires: str, whose: str = "") -> dict:
    """A metric-name -> value mapping (what ``reduce()`` or ``as_dict()`` gave)."""
    if not isinstance(raw, Mapping):
        raise bad(call, f"{whose}{shown(raw)}", requires)
    return dict(raw)


def metric_value(call: str, name: str, value: Any, requires: str) -> None:
    """A metric kvgate reads must be a number (``None``: not reported, which the oracle
    judges)."""
    if value is None or isinstance(value, numbers.Real) and not isinstance(value, bool):
        return
    raise bad(call, f"stats whose {name} is {shown(value)}", requires)


def config_info(call: str, answer: Any, requires: str) -> list[dict]:
    """A sequence of mappings from label to a str, int, float or bool."""
    items = _sequence(answer)
    ok = items is not None and all(
        isinstance(m, Mapping)
        and all(isinstance(k, str) and isinstance(v, (str, numbers.Real)) for k, v in m.items())
        for m in items
    )
    if not ok or items is None:
        raise bad(call, shown(answer), requires)
    return [dict(m) for m in items]


def boolean(call: str, answer: Any, requires: str) -> bool:
    if isinstance(answer, bool) or type(answer).__name__ == "bool_":  # numpy's bool too
        return bool(answer)
    raise bad(call, shown(answer), requires)


def named(call: str, answer: Any, requires: str, allowed: Iterable[str] | None = None) -> str:
    """An enum member or a str, as its plain value (``CacheHitSource.HOST`` -> ``"host"``);
    ``allowed``: the member names the interface has (a lookup's)."""
    value = getattr(answer, "value", answer)
    if allowed is not None:
        value = getattr(answer, "name", answer)
        if isinstance(value, str) and value.upper() in set(allowed):
            return value.upper()
        raise bad(call, shown(answer), requires)
    if isinstance(value, str) and value:
        return value
    raise bad(call, shown(answer), requires)
