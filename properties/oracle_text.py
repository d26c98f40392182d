"""How the oracle writes what it saw: keys, calls, answers and the ``Divergence`` message.

``fmt_key`` names a key shortly (its hash as an int for 8-byte hashes, else hex, and the group
when it is not 0). ``CallText`` writes a call as a person reads it, with request contexts by
the names the driving machine gave them (``Handles.name``) and keys by ``key_name``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvgate.impl.base import GROUP_BYTES, key_group

from .offers import Handles


def fmt_key(key: Any) -> str:
    if not isinstance(key, bytes) or len(key) <= GROUP_BYTES:
        return repr(key)
    h, group = key[:-GROUP_BYTES], key_group(key)
    name = str(int.from_bytes(h, "big")) if len(h) == 8 and h[:4] == b"\0\0\0\0" else h.hex()[:10]
    return f"k{name}" + (f"/g{group}" if group else "")


class Named(str):
    """A context, remembered by its name (so a call's record keeps no context alive)."""


class CallText:
    def __init__(self, handles: Handles, key_name: Callable[[Any], str] = fmt_key):
        self.handles = handles
        self.key_name = key_name

    def keys(self, keys: Iterable[Any]) -> str:
        return "[" + ", ".join(repr(self.key_name(k)) for k in keys) + "]"

    def call(self, name: str, args: tuple) -> str:
        parts = []
        for a in args:
            if isinstance(a, Named):
                parts.append(str(a))
            elif isinstance(a, list):
                parts.append(self.keys(a))
            elif isinstance(a, bytes):
                parts.append(repr(self.key_name(a)))
            elif a is None or isinstance(a, (bool, int, str)):
                parts.append(repr(a))
            else:
                parts.append(self.handles.name_of(a))
        return f"{name}({', '.join(parts)})"

    def remembered(self, args: tuple) -> tuple:
        """``args`` with a trailing context replaced by its name."""
        if args and not isinstance(args[-1], (list, bytes, bool, int, str, type(None))):
            return args[:-1] + (Named(self.handles.name_of(args[-1])),)
        return args

    def store(self, out: Any, exact: bool = True) -> str:
        if out is None:
            return "None"
        keys, ids, evicted = out
        if not exact:
            return f"store {self.keys(keys)}"
        return f"store {self.keys(keys)} in chunks {list(ids)}, evict {self.keys(evicted)}"

    def events(self, events: Iterable[tuple]) -> str:
        parts = []
        for keys, removed, meta, *_ in events:
            parts.append(
                ("removed" if removed else "stored")
                + ("(metadata)" if meta else "")
                + " "
                + self.keys(keys)
            )
        return "[" + "; ".join(parts) + "]"

    def policy(self, state: dict) -> dict:
        return {k: v if k == "p" else [self.key_name(x) for x in v] for k, v in state.items()}

    def tracker(self, items: Iterable[tuple]) -> list:
        return [(self.key_name(k), n) for k, n in items]


def divergence_message(
    step: int, call_no: int, what: str, target: Any, model: Any, why: str, recent: list[str]
) -> str:
    return (
        f"divergence at step {step}, call {call_no}: {what}"
        f"\n  target answered: {target}\n  model answered:  {model}"
        + (f"\n  ({why})" if why else "")
        + ("\n calls before it:\n" + "\n".join(recent) if recent else "")
    )
