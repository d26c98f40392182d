"""A manager proxy that checks every call against the reference model, in lockstep.

``LockstepManager(target, model)`` stands where the scheduler driver expects a manager. Each call
goes to the target and to ``model.cache.Model``, and the answers are compared at once: lookup
results, admitted keys, chunk ids and evictions (adopted, not predicted, for a foreign target:
SPEC section 9), load specs, events and stats. The first difference raises ``Divergence``, an
``AssertionError`` that names the scheduler step, the call number and the call, with the calls
just before it.

The model takes an opaque, hashable handle per request context; the proxy hands out one int per
``ReqContext`` object, so a new context is a new request even when its ``req_id`` is reused.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from typing import Any

from kvgate.model.cache import AdmissionDiffers, Model, ModelError

STORES_SKIPPED = "vllm:kv_offload_stores_skipped"


class Divergence(AssertionError):
    """The target and the model answered one call differently."""

    def __init__(self, message: str, step: int, call_no: int, call: str):
        super().__init__(message)
        self.step = step
        self.call_no = call_no
        self.call = call


def fmt_key(key: Any) -> str:
    """A short, readable name for a key: its hash as an int (8-byte hashes) or hex, and the
    group when it is not 0."""
    if not isinstance(key, bytes) or len(key) < 5:
        return repr(key)
    h, group = key[:-4], int.from_bytes(key[-4:], "big")
    name = str(int.from_bytes(h, "big")) if len(h) == 8 and h[:4] == b"\0\0\0\0" else h.hex()[:10]
    return f"k{name}" + (f"/g{group}" if group else "")


def fmt_keys(keys: Iterable[Any]) -> str:
    return "[" + ", ".join(fmt_key(k) for k in keys) + "]"


def lookup_name(result: Any) -> str:
    """``LookupResult.HIT`` (ours or upstream's) or ``"HIT"`` -> ``"HIT"``."""
    name = getattr(result, "name", result)
    return str(name).upper()


def stats_dict(stats: Any) -> dict[str, Any]:
    if isinstance(stats, dict):
        return stats
    if hasattr(stats, "as_dict"):
        return stats.as_dict()
    if hasattr(stats, "reduce"):
        return dict(stats.reduce())
    raise TypeError(f"cannot read stats {stats!r}")


def event_tuple(event: Any) -> tuple[tuple[bytes, ...], bool, bool]:
    if isinstance(event, tuple):
        keys, removed, metadata_only = event
    else:
        keys, removed = event.keys, event.removed
        metadata_only = getattr(event, "metadata_only", False)
    return tuple(keys), bool(removed), bool(metadata_only)


def chunk_ids(spec: Any) -> list[int]:
    return [int(i) for i in getattr(spec, "block_ids", spec)]


def _same_stats(target: dict[str, Any], model: dict[str, Any], foreign: bool = False) -> bool:
    """Same metrics, same values. A foreign target may leave out a metric it cannot report
    (its adapter gives None or nothing); a metric the model does not have must then be zero."""
    if foreign:
        names = {n for n in model if target.get(n) is not None}
        if any(target[n] for n in set(target) - set(model) if target[n] is not None):
            return False
    elif set(target) != set(model):
        return False
    else:
        names = set(model)
    for name in sorted(names):
        x, y = target[name], model[name]
        if isinstance(x, (list, tuple)) or isinstance(y, (list, tuple)):
            if [float(v) for v in x] != [float(v) for v in y]:
                return False
        elif not math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-9):
            return False
    return True


class _Key:
    __slots__ = ("key",)

    def __init__(self, key: bytes):
        self.key = key


class _Call:
    """One call, formatted only when a divergence needs it."""

    __slots__ = ("step", "no", "name", "args", "kwargs")

    def __init__(self, step: int, no: int, name: str, args: tuple, kwargs: dict):
        self.step, self.no, self.name, self.args, self.kwargs = step, no, name, args, kwargs

    def __str__(self) -> str:
        parts = [fmt_key(a.key) if isinstance(a, _Key) else fmt_keys(a) if isinstance(a, list)
                 else repr(a) for a in self.args]
        parts += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"{self.name}({', '.join(parts)})"


class LockstepManager:
    """Forwards the manager protocol to ``target`` and ``model`` and compares every answer.

    ``foreign``: the target's evictions and chunk ids are checked for legality and adopted
    by the model instead of compared. ``step`` is set by whoever drives (the scheduler's
    ``on_step`` hook) and appears in every divergence.
    """

    def __init__(self, target: Any, model: Model, *, foreign: bool = False,
                 history: int = 12, log: list[dict[str, Any]] | None = None):
        self.target = target
        self.model = model
        self.foreign = foreign
        self.step = 0
        self.calls = 0
        self._recent: deque[str] = deque(maxlen=history)
        self._handles: dict[int, tuple[Any, int]] = {}
        self._next_handle = 0
        self.log = log  # when given: every prepare_store and the divergent call, as dicts

    # --- bookkeeping
    def set_step(self, step: int) -> None:
        self.step = step

    def handle(self, ctx: Any) -> int:
        entry = self._handles.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            entry = (ctx, self._next_handle)
            self._next_handle += 1
            self._handles[id(ctx)] = entry
        return entry[1]

    def _call(self, name: str, *args: Any, **kwargs: Any) -> _Call:
        self.calls += 1
        call = _Call(self.step, self.calls, name, args, kwargs)
        self._recent.append(call)
        return call

    def _record(self, call: _Call, args: dict[str, Any], target: Any, model: Any) -> None:
        """One entry of ``log`` (the history ``kvgate check --history`` writes)."""
        if self.log is not None and not (self.log and self.log[-1].get("call_no") == call.no):
            self.log.append({"step": call.step, "call_no": call.no, "call": call.name,
                             "args": args, "target": str(target), "model": str(model)})

    def _diverge(self, call: _Call, target: Any, model: Any, why: str = "") -> Divergence:
        self._record(call, {"call": str(call)}, target, model)
        recent = "\n".join(f"  step {c.step}, call {c.no}: {c}" for c in list(self._recent)[:-1])
        msg = (f"divergence at step {self.step}, call {self.calls}: {call}\n"
               f"  target answered: {target}\n  model answered:  {model}"
               + (f"\n  ({why})" if why else "")
               + (f"\n calls before it:\n{recent}" if recent else ""))
        return Divergence(msg, self.step, self.calls, str(call))

    def _both(self, call: _Call, target_fn, model_fn) -> tuple[Any, Any]:
        """Run both sides; an exception on one side only is a divergence."""
        try:
            m = model_fn()
            m_err = None
        except ModelError as e:
            m, m_err = None, e
        try:
            t = target_fn()
        except Exception as e:  # noqa: BLE001 - any target error is an answer to compare
            if m_err is None:
                raise self._diverge(call, f"raised {type(e).__name__}: {e}", repr(m)) from e
            raise
        if m_err is not None:
            raise self._diverge(call, repr(t), f"raised ModelError: {m_err}")
        return t, m

    # --- the manager protocol
    def on_new_request(self, ctx: Any) -> None:
        self.handle(ctx)
        hook = getattr(self.target, "on_new_request", None)
        if hook is not None:
            hook(ctx)

    def on_request_finished(self, ctx: Any) -> None:
        hook = getattr(self.target, "on_request_finished", None)
        if hook is not None:
            hook(ctx)
        self._handles.pop(id(ctx), None)  # no prepare call comes for it any more

    def lookup(self, key: bytes, ctx: Any = None) -> Any:
        call = self._call("lookup", _Key(key), ctx)
        t, m = self._both(call, lambda: self.target.lookup(key, ctx), lambda: self.model.lookup(key))
        if lookup_name(t) != m:
            raise self._diverge(call, lookup_name(t), m)
        return t

    def touch(self, keys: Iterable[bytes], ctx: Any = None) -> None:
        if "touch" in getattr(self.target, "missing", ()):
            return  # a target without touch: neither side gets the recency hint
        keys = list(keys)
        call = self._call("touch", keys, ctx)
        self._both(call, lambda: self.target.touch(keys, ctx), lambda: self.model.touch(keys))

    def prepare_load(self, keys: Iterable[bytes], ctx: Any = None) -> Any:
        keys = list(keys)
        call = self._call("prepare_load", keys, ctx)
        t, m = self._both(call, lambda: self.target.prepare_load(keys, ctx),
                          lambda: self.model.prepare_load(keys))
        if chunk_ids(t) != list(m):
            raise self._diverge(call, f"chunks {chunk_ids(t)}", f"chunks {list(m)}")
        return t

    def complete_load(self, keys: Iterable[bytes], ctx: Any = None) -> None:
        keys = list(keys)
        call = self._call("complete_load", keys, ctx)
        self._both(call, lambda: self.target.complete_load(keys, ctx),
                   lambda: self.model.complete_load(keys))

    def prepare_store(self, keys: Iterable[bytes], ctx: Any) -> Any:
        keys = list(keys)
        req = self.handle(ctx)
        call = self._call("prepare_store", keys, ctx)
        try:
            t = self.target.prepare_store(keys, ctx)
        except Exception as e:  # noqa: BLE001
            raise self._diverge(call, f"raised {type(e).__name__}: {e}", "(not asked)") from e
        choice = stored = None
        if self.foreign and t is not None:
            t_stored, t_spec, t_evicted = t
            choice, stored = (list(t_evicted), chunk_ids(t_spec)), list(t_stored)
        try:
            m = self.model.prepare_store(keys, req, choice=choice, stored=stored)
        except AdmissionDiffers as e:  # the admission differs, not the choice
            raise self._diverge(call, f"store {fmt_keys(stored)}", f"store {fmt_keys(e.admitted)}",
                                "admitted keys differ") from e
        except ModelError as e:
            text = str(e)
            if len(text) > 400:
                text = text[:400] + " ..."
            raise self._diverge(call, _fmt_store(t), f"refused the target's choice: {text}") from e
        self._record(call, {"keys": fmt_keys(keys), "req": req}, _fmt_store(t), _fmt_store(m))
        if (t is None) != (m is None):
            raise self._diverge(call, _fmt_store(t), _fmt_store(m))
        if t is None:
            return t
        t_keys, t_spec, t_evicted = t  # PrepareStoreOutput or an adapter's plain tuple
        t_keys, t_ids, t_evicted = list(t_keys), chunk_ids(t_spec), list(t_evicted)
        m_keys, m_ids, m_evicted = m
        if t_keys != list(m_keys):
            raise self._diverge(call, _fmt_store(t), _fmt_store(m), "admitted keys differ")
        if not self.foreign and (t_ids != list(m_ids) or t_evicted != list(m_evicted)):
            raise self._diverge(call, _fmt_store(t), _fmt_store(m), "chunk ids or evictions differ")
        return t

    def complete_store(self, keys: Iterable[bytes], ctx: Any = None, success: bool = True) -> None:
        keys = list(keys)
        call = self._call("complete_store", keys, ctx, success=success)
        self._both(call, lambda: self.target.complete_store(keys, ctx, success=success),
                   lambda: self.model.complete_store(keys, success=success))

    def reset_cache(self) -> None:
        call = self._call("reset_cache")
        self._both(call, self.target.reset_cache, self.model.reset_cache)

    def take_events(self) -> list[Any]:
        call = self._call("take_events")
        t, m = self._both(call, lambda: list(self.target.take_events()), self.model.take_events)
        if [event_tuple(e) for e in t] != [event_tuple(e) for e in m]:
            raise self._diverge(call, _fmt_events(t), _fmt_events(m))
        return t

    def get_stats(self) -> Any:
        call = self._call("get_stats")
        t, m = self._both(call, self.target.get_stats, self.model.get_stats)
        td, md = stats_dict(t), stats_dict(m)
        if not _same_stats(td, md, self.foreign):
            raise self._diverge(call, _fmt_stats(td), _fmt_stats(md))
        return t

    def __getattr__(self, name: str) -> Any:  # inspection helpers of the target
        return getattr(self.target, name)


def _fmt_store(out: Any) -> str:
    if out is None:
        return "None"
    keys, spec, evicted = out
    ids = chunk_ids(spec)
    return f"store {fmt_keys(keys)} in chunks {list(ids)}, evict {fmt_keys(evicted)}"


def _fmt_events(events: Iterable[Any]) -> str:
    parts = []
    for e in events:
        keys, removed, meta = event_tuple(e)
        parts.append(("removed" if removed else "stored") + ("(metadata)" if meta else "")
                     + " " + fmt_keys(keys))
    return "[" + "; ".join(parts) + "]"


def _fmt_stats(d: dict[str, Any]) -> str:
    return ", ".join(f"{k.removeprefix('vllm:kv_offload_')}={v}" for k, v in sorted(d.items()))
