"""The lockstep oracle: every manager call goes to the target and to the reference model, and the
answers are compared at once, through one set of rules. Every machine and the replay use it.

``LockstepManager(target, model)`` stands where a manager is expected (the manager machine's
rules call it; the scheduler driver takes it as its manager). ``target`` is an adapter
(``properties.targets``), which answers in kvgate's plain values; the model answers in the
same values, so answers are compared as they are. The rules:

- **exact** (a native target): every answer equals the model's: lookups, load chunk ids, the
  admitted keys, their chunk ids and the evicted keys, events, stats; ``check_state()`` also
  compares the tracker (keys, counts, recency), the policy's order and the pool.
- **foreign** (SPEC section 9): the admitted keys and everything the admission rule fixes are
  compared exactly; the target's eviction and chunk-id choices are checked for legality and
  adopted by the model; what an adapter cannot see is skipped (``EXACT_ONLY`` names it).
- **independent of the model**, always: no tracked count exceeds the distinct (request,
  generation) pairs that offered the key since it last entered the tracker, the tracker stays
  within ``max_tracker_size``, and the events drained so far replay to the model's ready keys
  (restarting at a reset; events of an older generation drained after it are not replayed).

The first difference raises ``Divergence``, an ``AssertionError`` naming the step, the call
number and the call, with the calls just before it. The model takes an opaque handle per
request context: one int per context object, so a new context is a new request even when its
``req_id`` is reused; the handle is released at ``on_request_finished``.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from kvgate.impl.base import STORES_SKIPPED
from kvgate.model.cache import AdmissionDiffers, Model, ModelError

# Properties that need what an adapter of a foreign manager cannot see or fix.
EXACT_ONLY = ("chunk ids equal the model's", "evicted keys equal the model's",
              "policy order equals the model's", "pool accounting",
              "bad input leaves state unchanged", "repeated keys in one offer")


class Divergence(AssertionError):
    """The target and the model answered one call differently, or an invariant broke."""

    def __init__(self, message: str, step: int = 0, call_no: int = 0, call: str = "",
                 last_call: str = ""):
        super().__init__(message)
        self.step = step
        self.call_no = call_no
        self.call = call  # the call that answered differently, or the check that failed
        self.last_call = last_call  # the latest call made to both sides (same as ``call``
        # when a call's answers differed)


def fmt_key(key: Any) -> str:
    """A short, readable name for a key: its hash as an int (8-byte hashes) or hex, and the
    group when it is not 0."""
    if not isinstance(key, bytes) or len(key) < 5:
        return repr(key)
    h, group = key[:-4], int.from_bytes(key[-4:], "big")
    name = str(int.from_bytes(h, "big")) if len(h) == 8 and h[:4] == b"\0\0\0\0" else h.hex()[:10]
    return f"k{name}" + (f"/g{group}" if group else "")


class _Named(str):
    """A context, remembered by its name."""


def _close(x: Any, y: Any) -> bool:
    if isinstance(x, (list, tuple)) or isinstance(y, (list, tuple)):
        return isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and \
            [float(v) for v in x] == [float(v) for v in y]
    try:
        return math.isclose(float(x), float(y), rel_tol=0.0, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


class LockstepManager:
    """Forwards the manager protocol to ``target`` and ``model`` and compares every answer.

    ``foreign``: the target's evictions and chunk ids are checked for legality and adopted.
    ``key_name``: how keys are written in a divergence (the manager machine names them 'A'..).
    ``log``: a list that receives one entry per call (the history ``--history`` writes).
    ``step`` is set by whoever drives (``set_step``) and appears in every divergence.
    """

    def __init__(self, target: Any, model: Model, *, foreign: bool = False, history: int = 12,
                 log: list[dict[str, Any]] | None = None,
                 key_name: Callable[[Any], str] = fmt_key):
        self.target = target
        self.model = model
        self.foreign = foreign
        self.key_name = key_name
        self.missing = frozenset(getattr(target, "missing", ()))
        self.step = 0
        self.calls = 0
        self.log = log
        self._recent: deque[tuple] = deque(maxlen=history)
        self._handles: dict[int, tuple[Any, int, str]] = {}  # id(ctx) -> (ctx, handle, name)
        self._next_handle = 0
        self._generation = 0
        self._offerers: dict[bytes, set[tuple[int, int]]] = {}  # since the key entered
        self._replayed: set[bytes] = set()  # ready keys, from the target's drained events
        self._dirty: set[bytes] = set()  # keys whose residency may have changed
        self._order_dirty = self._tracker_dirty = False

    # --- bookkeeping
    def set_step(self, step: int) -> None:
        self.step = step

    def handle(self, ctx: Any) -> int:
        entry = self._handles.get(id(ctx))
        if entry is None or entry[0] is not ctx:
            entry = (ctx, self._next_handle, "")
            self._next_handle += 1
            self._handles[id(ctx)] = entry
        return entry[1]

    def name(self, ctx: Any, text: str) -> None:
        """How ``ctx`` is written in a divergence (the machine's bundle name)."""
        self.handle(ctx)
        ctx_, handle, _ = self._handles[id(ctx)]
        self._handles[id(ctx)] = (ctx_, handle, text)

    def _ctx_name(self, ctx: Any) -> str:
        entry = self._handles.get(id(ctx))
        return entry[2] if entry is not None and entry[0] is ctx and entry[2] else repr(ctx)

    def _keys(self, keys: Iterable[Any]) -> str:
        return "[" + ", ".join(repr(self.key_name(k)) for k in keys) + "]"

    def _text(self, name: str, args: tuple) -> str:
        parts = []
        for a in args:
            if isinstance(a, _Named):
                parts.append(str(a))
            elif isinstance(a, list):
                parts.append(self._keys(a))
            elif isinstance(a, bytes):
                parts.append(repr(self.key_name(a)))
            elif a is None or isinstance(a, (bool, int, str)):
                parts.append(repr(a))
            else:
                parts.append(self._ctx_name(a))
        return f"{name}({', '.join(parts)})"

    def _call(self, name: str, *args: Any) -> int:
        """Remember the call; a context by its name only, so that the oracle never keeps a
        finished request's context alive."""
        self.calls += 1
        if args and not isinstance(args[-1], (list, bytes, bool, int, str, type(None))):
            args = args[:-1] + (_Named(self._ctx_name(args[-1])),)
        self._recent.append((self.step, self.calls, name, args))
        return self.calls

    def _record(self, name: str, args: tuple, target: Any, model: Any) -> None:
        """One entry of the history: the call, its arguments as text, both answers."""
        if self.log is not None:
            self.log.append({"step": self.step, "call_no": self.calls, "call": name,
                             "args": self._text("", args), "target": target, "model": model})

    def diverge(self, what: str, target: Any, model: Any, why: str = "") -> Divergence:
        """The ``Divergence`` for the latest call (``what``: its text, or a check's name)."""
        if self.log is not None:
            self.log.append({"step": self.step, "call_no": self.calls,
                             "call": what.partition("(")[0], "args": what, "target": target,
                             "model": model, "why": why, "diverged": True})
        recent = "\n".join(f"  step {s}, call {n}: {self._text(c, a)}"
                           for s, n, c, a in list(self._recent)[:-1])
        msg = (f"divergence at step {self.step}, call {self.calls}: {what}"
               f"\n  target answered: {target}\n  model answered:  {model}"
               + (f"\n  ({why})" if why else "")
               + (f"\n calls before it:\n{recent}" if recent else ""))
        last = self._recent[-1] if self._recent else None
        return Divergence(msg, self.step, self.calls, what,
                          self._text(last[2], last[3]) if last else "")

    def _both(self, name: str, args: tuple, target_fn: Callable[[], Any],
              model_fn: Callable[[], Any]) -> tuple[Any, Any]:
        """Run both sides; an exception on one side only is a divergence."""
        try:
            m, m_err = model_fn(), None
        except ModelError as e:
            m, m_err = None, e
        try:
            t = target_fn()
        except Exception as e:  # noqa: BLE001 - any target error is an answer to compare
            if m_err is None:
                raise self.diverge(self._text(name, args), f"raised {type(e).__name__}: {e}",
                                   repr(m)) from e
            raise
        if m_err is not None:
            raise self.diverge(self._text(name, args), repr(t), f"raised ModelError: {m_err}")
        return t, m

    def _expect(self, name: str, args: tuple, t: Any, m: Any, shown=None, why: str = "") -> None:
        if t != m:
            show = shown or (lambda x: x)
            raise self.diverge(self._text(name, args), show(t), show(m), why)

    # --- the manager protocol
    def on_new_request(self, ctx: Any) -> None:
        self.handle(ctx)
        self.target.on_new_request(ctx)

    def on_request_finished(self, ctx: Any) -> None:
        self.target.on_request_finished(ctx)
        self._handles.pop(id(ctx), None)  # no prepare call comes for it any more

    def lookup(self, key: bytes, ctx: Any = None) -> Any:
        args = (key,)
        self._call("lookup", *args)
        t, m = self._both("lookup", args, lambda: self.target.lookup(key, ctx),
                          lambda: self.model.lookup(key))
        self._expect("lookup", args, t, m)
        return t

    def touch(self, keys: Iterable[bytes], ctx: Any = None) -> None:
        if "touch" in self.missing:
            return  # a target without touch: neither side gets the recency hint
        keys = list(keys)
        self._call("touch", keys)
        self._both("touch", (keys,), lambda: self.target.touch(keys, ctx),
                   lambda: self.model.touch(keys))
        self._order_dirty = True

    def prepare_load(self, keys: Iterable[bytes], ctx: Any = None) -> Any:
        keys = list(keys)
        self._call("prepare_load", keys)
        t, m = self._both("prepare_load", (keys,),
                          lambda: self.target.prepare_load(keys, ctx),
                          lambda: self.model.prepare_load(keys))
        self._record("prepare_load", (keys,), t, m)
        self._expect("prepare_load", (keys,), list(t), m, why="load chunk ids differ")
        self._dirty.update(keys)  # ref counts moved
        return t

    def complete_load(self, keys: Iterable[bytes], ctx: Any = None) -> None:
        keys = list(keys)
        self._call("complete_load", keys)
        self._both("complete_load", (keys,), lambda: self.target.complete_load(keys, ctx),
                   lambda: self.model.complete_load(keys))
        self._dirty.update(keys)

    def prepare_store(self, keys: Iterable[bytes], ctx: Any) -> Any:
        keys = list(keys)
        args = (keys, ctx)
        req = self.handle(ctx)
        self._call("prepare_store", keys, ctx)
        before = {k for k, _ in self.model.tracker}
        try:
            t = self.target.prepare_store(keys, ctx)
        except Exception as e:  # noqa: BLE001
            raise self.diverge(self._text("prepare_store", args),
                               f"raised {type(e).__name__}: {e}", "(not asked)") from e
        choice = stored = None
        if self.foreign and t is not None:
            choice, stored = (list(t[2]), list(t[1])), list(t[0])
        try:
            m = self.model.prepare_store(keys, req, choice=choice, stored=stored)
        except AdmissionDiffers as e:  # the admission differs, not the choice
            self._record("prepare_store", args, self._store(t, exact=False),
                         self._store((e.admitted, [], []), exact=False))
            raise self.diverge(self._text("prepare_store", args), self._store(t, exact=False),
                               self._store((e.admitted, [], []), exact=False),
                               "admitted keys differ") from e
        except ModelError as e:
            raise self.diverge(self._text("prepare_store", args), self._store(t),
                               f"refuses the target's choice: {str(e)[:400]}") from e
        exact = not self.foreign
        self._record("prepare_store", args, self._store(t, exact), self._store(m, exact))
        if (t is None) != (m is None) or (t is not None and list(t[0]) != list(m[0])):
            raise self.diverge(self._text("prepare_store", args), self._store(t, exact),
                               self._store(m, exact), "admitted keys differ")
        if exact and t is not None and (list(t[1]) != list(m[1]) or list(t[2]) != list(m[2])):
            raise self.diverge(self._text("prepare_store", args), self._store(t),
                               self._store(m), "chunk ids or evictions differ")
        self._offered(keys, req, before)
        self._dirty.update(keys)
        if t is not None:
            self._dirty.update(t[2])
        self._order_dirty = True
        return t

    def _store(self, out: Any, exact: bool = True) -> str:
        if out is None:
            return "None"
        keys, ids, evicted = out
        if not exact:
            return f"store {self._keys(keys)}"
        return f"store {self._keys(keys)} in chunks {list(ids)}, evict {self._keys(evicted)}"

    def _offered(self, keys: list[bytes], req: int, before: set[bytes]) -> None:
        """Who offered each key since it last entered the tracker (amended A2's bound)."""
        if self.model.threshold < 2:
            return
        who = (req, self._generation)
        for k in keys:
            offerers = self._offerers.get(k) if k in before else None
            if offerers is None:  # it enters (or tries to) now: its offerers start over
                self._offerers[k] = {who}
            else:
                offerers.add(who)
        self._tracker_dirty = True

    def complete_store(self, keys: Iterable[bytes], ctx: Any = None, success: bool = True) -> None:
        keys = list(keys)
        self._call("complete_store", keys, success)
        self._both("complete_store", (keys, success),
                   lambda: self.target.complete_store(keys, ctx, success=success),
                   lambda: self.model.complete_store(keys, success=success))
        self._dirty.update(keys)
        self._order_dirty = True

    def reset_cache(self) -> None:
        self._call("reset_cache")
        self._dirty.update(self.model.resident)
        self._both("reset_cache", (), self.target.reset_cache, self.model.reset_cache)
        self._generation += 1
        self._replayed.clear()  # a consumer's replay starts over at a reset
        self._order_dirty = True

    def take_events(self) -> list[Any]:
        self._call("take_events")
        t, dated = self._both("take_events", (), lambda: list(self.target.take_events()),
                              lambda: self.model.take_events(generations=True))
        m = [event for event, _ in dated]
        if t or m:
            self._record("take_events", (), self._events(t), self._events(m))
        self._expect("take_events", (), [tuple(e) for e in t], m, shown=self._events)
        now = self.model.generation
        for (keys, removed, _), (_, generation) in zip(t, dated):
            if generation == now:  # older ones describe the cache before a reset
                (self._replayed.difference_update if removed else self._replayed.update)(keys)
        ready = {k for k, r in self.model.resident.items() if r["ref"] >= 0}
        if self._replayed != ready:
            raise self.diverge("ready keys replayed from the events", self._keys(
                sorted(self._replayed)), self._keys(sorted(ready)))
        return t

    def _events(self, events: Iterable[Any]) -> str:
        parts = []
        for keys, removed, meta in events:
            parts.append(("removed" if removed else "stored") + ("(metadata)" if meta else "")
                         + " " + self._keys(keys))
        return "[" + "; ".join(parts) + "]"

    def get_stats(self) -> dict[str, Any]:
        self._call("get_stats")
        t, m = self._both("get_stats", (), self.target.get_stats, self.model.get_stats)
        if m.get(STORES_SKIPPED) or m.get("vllm:kv_offload_cpu_allocation_size") or \
                t.get(STORES_SKIPPED):
            self._record("get_stats", (), t, m)
        for name, value in m.items():
            got = t.get(name)
            if got is None and self.foreign:
                continue  # an adapter that cannot see this metric
            if not _close(got, value):
                raise self.diverge("get_stats()", f"{name}={got}", f"{name}={value}",
                                   f"{name} differs")
        for name in sorted(set(t) - set(m)):
            if t[name]:
                raise self.diverge("get_stats()", f"{name}={t[name]}", "(no such metric)",
                                   "the target reports a metric the model does not have")
        return t

    # --- whole-state checks, incremental: what changed since the last check
    def check_state(self) -> None:
        """Lookups of the keys whose residency may have changed; after an offer the tracker
        (equal to the model's, bounded, no count above its offerers); for exact targets also
        the policy's order (if it may have moved) and the pool."""
        inspect = None if self.foreign else self._inspection()
        for k in self._dirty:
            t, m = self.target.lookup(k, None), self.model.lookup(k)
            if t != m:
                raise self.diverge(f"lookup({self.key_name(k)!r})", t, m)
            if inspect is not None:  # exact targets: the chunk id and ref count it reports
                entry = self.model.resident.get(k)
                want = (None, None) if entry is None else (entry["chunk"], entry["ref"])
                got = tuple(fn(k) for fn in inspect)
                if got != want:
                    raise self.diverge(f"(chunk_of, ref_count)({self.key_name(k)!r})", got,
                                       want)
        self._dirty.clear()
        if self._tracker_dirty:
            self._tracker_dirty = False
            self._check_tracker(self.target.tracker_items())
        if self.foreign or not self._order_dirty:
            return
        self._order_dirty = False
        free = self.target.free_chunks()
        if free is not None and free + len(self.model.resident) != self.model.num_chunks:
            raise self.diverge("free chunks + resident chunks", free + len(self.model.resident),
                               self.model.num_chunks)
        order = self.target.policy_state()
        if order is not None:
            want = self.model.policy_state()
            if order != want:
                show = lambda st: {k: v if k == "p" else [self.key_name(x) for x in v]  # noqa
                                   for k, v in st.items()}
                raise self.diverge("policy order (least recent first)", show(order), show(want))

    def _inspection(self) -> tuple[Callable, Callable] | None:
        """An exact target's ``chunk_of`` and ``ref_count`` (impl's inspection helpers), if it
        has both."""
        manager = getattr(self.target, "manager", None)
        fns = (getattr(manager, "chunk_of", None), getattr(manager, "ref_count", None))
        return fns if all(callable(fn) for fn in fns) else None

    def _check_tracker(self, got: list | None) -> None:
        want = self.model.tracker_items()
        if got is None and not want:
            return
        got = [tuple(x) for x in got or ()]
        if len(got) > self.model.max_tracker_size:
            raise self.diverge("tracker size", len(got), self.model.max_tracker_size,
                               "the tracker holds more keys than max_tracker_size")
        for k, n in got:  # independent of the model: the offers this oracle saw
            offerers = len(self._offerers.get(k, ()))
            if n > offerers:
                raise self.diverge(f"tracker count of {self.key_name(k)!r}", n,
                                   f"at most {offerers}", "a count exceeds the distinct "
                                   "requests that offered the key since it entered the tracker")
        if got != want:
            show = lambda items: [(self.key_name(k), n) for k, n in items]  # noqa: E731
            raise self.diverge("tracker (key, count), least recent first", show(got),
                               show(want))

    # --- bad input: a clear error, and nothing changes
    def refuse(self, name: str, args: tuple, fn: Callable[[], Any], key: Any) -> None:
        """``fn`` (a call the model refuses) must raise an error that names ``key`` and leave
        the target's state as it was (exact targets only: an adapter cannot show it all)."""
        self._call(name, *args)
        what = self._text(name, args)
        keys = list(self.model.resident) + [k for k, _ in self.model.tracker]
        before = self._snapshot(keys)
        try:
            fn()
        except Exception as exc:  # any clear error naming the key
            text = str(exc)
            if repr(key) not in text and str(self.key_name(key)) not in text:
                raise self.diverge(what, f"an error that does not name the key: {exc}",
                                   "an error naming the key") from None
        else:
            raise self.diverge(what, "accepted", "refused")
        after = self._snapshot(keys)
        if after != before:
            raise self.diverge(f"state after the refused {what}", after, before)

    def _snapshot(self, keys: list[bytes]) -> tuple:
        return ([self.target.lookup(k, None) for k in keys], self.target.tracker_items(),
                self.target.policy_state(), self.target.free_chunks(),
                [self.target.chunk_of(k) for k in keys])

    def __getattr__(self, name: str) -> Any:  # new_context and inspection helpers
        return getattr(self.target, name)
