"""The lockstep oracle: every manager call goes to the target and to the reference model, and the
answers are compared at once, through one set of rules. Every machine and the replay use it.

``LockstepManager(target, model)`` stands where a manager is expected (the manager machine's
rules call it; the scheduler drivers take it as their manager). ``target`` is an adapter
(``properties.adapters``), the only way the oracle reaches a manager; it answers in kvgate's
plain values, as the model does, so answers are compared as they are. The rules:

- **exact** (impl, ``MODULE:ATTR`` and vLLM releases: spec section 9): every answer equals
  the model's: lookups, load chunk ids, the admitted keys, their chunk ids and the evicted keys
  in order, events, every metric, the answers of ``on_new_request``, ``get_load_source``,
  ``config_info`` and ``has_pending_work``; ``check_state()`` also compares each resident key's
  chunk id and ref count, the tracker (keys, counts, recency), the policy's order and the pool,
  as far as the adapter can inspect them.
- **foreign** (``foreign=``, spec section 9): the admitted keys and everything the admission
  rule fixes are compared exactly; the target's eviction and chunk-id choices are checked for
  legality here and adopted by the model; what an adapter cannot see is skipped (``EXACT_ONLY``
  names it).
- **no silent metrics** (spec section 5): a ``get_stats()`` that returns nothing is a
  divergence; an exact target reports the model's metrics at every read; a foreign one keeps
  the set it reported first, and the skip metric whenever ``store_threshold >= 2``.
- **independent of the model**, always: no tracked count exceeds the distinct (request,
  generation) pairs that offered the key since it last entered the tracker
  (``properties.offers``), the tracker stays within ``max_tracker_size``, and the events
  drained so far replay to the model's ready keys (restarting at a reset).

The first difference raises ``Divergence``, an ``AssertionError`` naming the step, the call
number and the call, with the calls just before it (``properties.oracle_text`` writes them).
The model takes an opaque handle per request context (``properties.offers.Handles``), so a new
context is a new request even when its ``req_id`` is reused; keys' positions in a request
reach the model through the adapter, read from the context the target was given.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from kvgate.impl.base import STORES_SKIPPED
from kvgate.model.cache import NO_POSITIONS, Model, ModelError

from .adapters import EXACT_ONLY, BadAnswer, TargetError, harness_error, raised_at
from .answers import LEDGER
from .known import known_of
from .offers import Handles, Offers
from .oracle_retained import retained
from .oracle_text import CallText, divergence_message, fmt_key

__all__ = ["EXACT_ONLY", "Divergence", "LockstepManager", "build", "fmt_key"]

# spec §4.8: a manager retains at most RETAINED_FACTOR entries per thing it must hold, plus
# RETAINED_SLACK (fixed tables, and a lazy structure's stale entries before it compacts)
RETAINED_FACTOR = 8
RETAINED_SLACK = 128


class Divergence(AssertionError):
    """The target and the model answered one call differently, or an invariant broke."""

    def __init__(
        self, message: str, step: int = 0, call_no: int = 0, call: str = "", last_call: str = ""
    ):
        super().__init__(message)
        self.step = step
        self.call_no = call_no
        self.call = call  # the call that answered differently, or the check that failed
        self.last_call = last_call  # the latest call made to both sides (same as ``call``
        # when a call's answers differed)


def _close(x: Any, y: Any) -> bool:
    if isinstance(x, (list, tuple)) or isinstance(y, (list, tuple)):
        return (
            isinstance(x, (list, tuple))
            and isinstance(y, (list, tuple))
            and [float(v) for v in x] == [float(v) for v in y]
        )
    try:
        return math.isclose(float(x), float(y), rel_tol=0.0, abs_tol=1e-9)
    except (TypeError, ValueError):
        return False


def build(target: Any, config: Any, model: Model) -> Any:
    """``target.make(config)``, where a constructor that raises on a configuration the model
    accepts is a counterexample (spec section 9): a ``Divergence`` naming the configuration."""
    try:
        return target.make(config)
    except TargetError:
        raise
    except Exception as exc:
        raise Divergence(
            f"divergence at set-up: the target's constructor raised "
            f"{type(exc).__name__}: {exc}\n  for {config}, which the model "
            f"accepts ({model.num_chunks} chunks, {model.policy}, threshold "
            f"{model.threshold})",
            call="constructor",
        ) from exc


class LockstepManager:
    """Forwards the manager protocol to ``target`` and ``model`` and compares every answer.

    ``foreign``: the target's evictions and chunk ids are checked for legality and adopted.
    ``key_name``: how keys are written in a divergence (the manager machine names them 'A'..).
    ``log``: a list that receives one entry per call (the history ``--history`` writes).
    ``handles``: the request names, shared by the oracles of one machine.
    ``step`` is set by whoever drives (``set_step``) and appears in every divergence.
    """

    def __init__(
        self,
        target: Any,
        model: Model,
        *,
        foreign: bool = False,
        history: int = 12,
        log: list[dict[str, Any]] | None = None,
        key_name: Callable[[Any], str] = fmt_key,
        handles: Handles | None = None,
    ):
        self.target = target
        self.model = model
        self.foreign = foreign
        self.missing = frozenset(target.missing)
        # Declared known defects (properties/known.py): counted where they differ, not compared.
        self.known = known_of(target)
        # Where the target's tracker counts, as its adapter learnt it (spec §3.2): every
        # machine's model follows it, whoever built the model.
        feed = getattr(target, "feed", None)
        if feed in ("offer", "lookup"):
            model.feed = feed
        self.handles = handles if handles is not None else Handles()
        self.offers = Offers()
        self.text = CallText(self.handles, key_name)
        self.key_name = key_name
        self.inspect = not foreign and target.inspectable()
        self.step = 0
        self.calls = 0
        self.log = log
        self._recent: deque[tuple] = deque(maxlen=history)
        self._metrics: frozenset[str] | None = None  # a foreign target's first-read metric set
        self._replayed: set[bytes] = set()  # ready keys, from the target's drained events
        self._dirty: set[bytes] = set()  # keys whose residency may have changed
        self._order_dirty = self._tracker_dirty = False
        # what the retained-state bound counts (spec §4.8): the keys named to this manager, and
        # per request (by handle) the keys it named
        self._keys_named: set[bytes] = set()
        self._named_by: dict[int, set[bytes]] = {}
        self._context_types: set[type] = set()
        self.unmeasured = ""  # why the retained state is not measured (never a verdict)
        self._largest: tuple[tuple[str, int], ...] = ()  # the latest measure's largest ones
        # what the manager holds as built (its fixed tables): the bound's starting point
        self._built = self._measure([])

    # --- bookkeeping
    def set_step(self, step: int) -> None:
        self.step = step

    def handle(self, ctx: Any) -> int:
        return self.handles.of(ctx)

    def name(self, ctx: Any, text: str) -> None:
        self.handles.name(ctx, text)

    def new_context(self, req_id: str) -> Any:
        """A request context of the target's own type (the model needs none)."""
        ctx = self.target.new_context(req_id)
        self._context_types.add(type(ctx))
        return ctx

    def set_position(self, ctx: Any, key: bytes, position: int) -> None:
        """Record where ``key`` ends in the request, on the context both sides read."""
        self.target.set_position(ctx, key, position)

    def position(self, ctx: Any, key: bytes) -> int | None:
        return self.target.position(ctx, key)

    def _position(self, ctx: Any) -> Callable[[bytes], int | None]:
        if ctx is None:
            return NO_POSITIONS
        return lambda key: self.target.position(ctx, key)

    def _call(self, name: str, *args: Any) -> int:
        self.calls += 1
        self._recent.append((self.step, self.calls, name, self.text.remembered(args)))
        return self.calls

    def _record(self, name: str, args: tuple, target: Any, model: Any) -> None:
        """One entry of the history: the call, its arguments as text, both answers."""
        if self.log is not None:
            self.log.append(
                {
                    "step": self.step,
                    "call_no": self.calls,
                    "call": name,
                    "args": self.text.call("", args),
                    "target": target,
                    "model": model,
                }
            )

    def diverge(self, what: str, target: Any, model: Any, why: str = "") -> Divergence:
        """The ``Divergence`` for the latest call (``what``: its text, or a check's name)."""
        if self.log is not None:
            entry = {
                "step": self.step,
                "call_no": self.calls,
                "call": what.partition("(")[0],
                "args": what,
                "target": target,
                "model": model,
                "why": why,
                "diverged": True,
            }
            last = self.log[-1] if self.log else None
            if (
                last is not None
                and last.get("call_no") == self.calls
                and last.get("call") == entry["call"]
            ):
                last.update(why=why, diverged=True)  # the call's own entry says it diverged
            else:
                self.log.append(entry)
        recent = [
            f"  step {s}, call {n}: {self.text.call(c, a)}"
            for s, n, c, a in list(self._recent)[:-1]
        ]
        latest = self._recent[-1] if self._recent else None
        return Divergence(
            divergence_message(self.step, self.calls, what, target, model, why, recent),
            self.step,
            self.calls,
            what,
            self.text.call(latest[2], latest[3]) if latest else "",
        )

    def _both(
        self, name: str, args: tuple, target_fn: Callable[[], Any], model_fn: Callable[[], Any]
    ) -> tuple[Any, Any]:
        """Run both sides; an exception on one side only is a divergence."""
        self._call(name, *args)
        try:
            m, m_err = model_fn(), None
        except ModelError as e:
            m, m_err = None, e
        try:
            t = target_fn()
        except Exception as e:
            if m_err is None:
                raise self.raised(self.text.call(name, args), e, repr(m)) from e
            raise
        if m_err is not None:
            raise self.diverge(self.text.call(name, args), repr(t), f"raised ModelError: {m_err}")
        return t, m

    def raised(self, what: str, exc: Exception, model: Any = "(not asked)") -> Exception:
        """What an exception out of a target call is (spec §9): raised in the target, a
        divergence naming the call, the exception and where in the target it was raised; an
        answer the interface does not allow (``BadAnswer``), a divergence too; raised in
        kvgate's own code (the adapter, the oracle), a ``TargetError`` (exit 2, one line),
        never a verdict, unless the target had already answered something ill-formed in this
        example (``answers.LEDGER``): then that answer is the finding, and what kvgate raised
        reading on is named beside it."""
        if isinstance(exc, TargetError):
            return exc
        if isinstance(exc, BadAnswer):
            return self.diverge(what, str(exc), model, "an answer the interface does not allow")
        where, harness = raised_at(exc)
        if harness and LEDGER.first:
            return self.diverge(
                what,
                f"{LEDGER.first} (kvgate then raised {type(exc).__name__} at {where})",
                model,
                "an answer the interface does not allow",
            )
        if harness:
            during = f"{what} (step {self.step}, call {self.calls})"
            return harness_error(exc, where, during, getattr(self.target, "release", ""))
        return self.diverge(
            what, f"raised {type(exc).__name__}: {exc} (at {where})", model, "the target raised"
        )

    def _expect(self, name: str, args: tuple, t: Any, m: Any, shown=None, why: str = "") -> None:
        if t != m:
            show = shown or (lambda x: x)
            raise self.diverge(self.text.call(name, args), show(t), show(m), why)

    def _answer(self, name: str, args: tuple, target_fn, model_fn) -> Any:
        """An optional interface call whose answer is compared (spec section 9); ``None`` and
        no call on either side where the target lacks it."""
        if name in self.missing:
            return None
        t, m = self._both(name, args, target_fn, model_fn)
        if self._known(name, t, m):
            return t
        self._expect(name, args, t, m, why=f"{name} answers differ")
        return t

    def _known(self, name: str, target: Any, model: Any, differs: bool | None = None) -> bool:
        """Whether ``name`` is a declared known defect (then a difference is counted there,
        never raised)."""
        if self.known is None or name not in self.known:
            return False
        if differs if differs is not None else target != model:
            self.known.saw(name, target, model, self)
        return True

    # --- the request lifecycle and the interface answers
    def on_new_request(self, ctx: Any) -> Any:
        req = self.handle(ctx)
        return self._answer(
            "on_new_request",
            (ctx,),
            lambda: self.target.on_new_request(ctx),
            lambda: self._offload_policy(self.model.on_new_request(req)),
        )

    def _offload_policy(self, model_answer: Any) -> Any:
        """The policy a request must be given: the one the adapter learnt from the release
        (its documented choice, spec §10: 0.24.0-0.29.0 answer block-level), else the
        model's."""
        learned = getattr(self.target, "offload_policy", None)
        return model_answer if learned is None else learned

    def on_request_finished(self, ctx: Any) -> None:
        if "on_request_finished" in self.missing:
            return
        req = self.handle(ctx)
        self._both(
            "on_request_finished",
            (ctx,),
            lambda: self.target.on_request_finished(ctx),
            lambda: self.model.on_request_finished(req, self._position(ctx)),
        )
        self._order_dirty = True

    def get_load_source(self, key: bytes, ctx: Any = None) -> Any:
        return self._answer(
            "get_load_source",
            (key,),
            lambda: self.target.get_load_source(key, ctx),
            lambda: self.model.get_load_source(key),
        )

    def config_info(self) -> Any:
        return self._answer("config_info", (), self.target.config_info, self.model.config_info)

    def has_pending_work(self) -> Any:
        return self._answer(
            "has_pending_work", (), self.target.has_pending_work, self.model.has_pending_work
        )

    # --- loads
    def lookup(self, key: bytes, ctx: Any = None) -> Any:
        """A lookup; on a target whose tracker is fed at lookups (spec §3.2) it counts, once
        per request and generation, in the model too, and the tracker is checked after it."""
        args = (key,)
        self._named((key,), ctx)
        counts = ctx is not None and self.model.feed == "lookup" and self.model.threshold >= 2
        req = self.handle(ctx) if counts else None  # else no handle: lookups name no request
        before = {k for k, _ in self.model.tracker}
        t, m = self._both(
            "lookup",
            args,
            lambda: self.target.lookup(key, ctx),
            lambda: self.model.lookup(key, req),
        )
        self._expect("lookup", args, t, m)
        if counts:
            assert req is not None  # counts: the handle was taken above
            self.offers.offered([key], req, before)
            self._tracker_dirty = True
        return t

    def touch(self, keys: Iterable[bytes], ctx: Any = None) -> None:
        if "touch" in self.missing:
            return  # a target without touch: neither side gets the recency hint
        keys = list(keys)
        self._named(keys, ctx)
        self._both(
            "touch", (keys,), lambda: self.target.touch(keys, ctx), lambda: self.model.touch(keys)
        )
        self._order_dirty = True

    def prepare_load(self, keys: Iterable[bytes], ctx: Any = None) -> Any:
        keys = list(keys)
        req = None if ctx is None else self.handle(ctx)
        self._named(keys, ctx)
        t, m = self._both(
            "prepare_load",
            (keys,),
            lambda: self.target.prepare_load(keys, ctx),
            lambda: self.model.prepare_load(keys, req, self._position(ctx)),
        )
        self._record("prepare_load", (keys,), t, m)
        self._expect("prepare_load", (keys,), list(t), m, why="load chunk ids differ")
        self._dirty.update(keys)  # ref counts moved
        self._order_dirty = True
        return t

    def complete_load(self, keys: Iterable[bytes], ctx: Any = None) -> None:
        keys = list(keys)
        self._both(
            "complete_load",
            (keys,),
            lambda: self.target.complete_load(keys, ctx),
            lambda: self.model.complete_load(keys),
        )
        self._dirty.update(keys)

    # --- stores
    def prepare_store(self, keys: Iterable[bytes], ctx: Any) -> Any:
        keys = list(keys)
        args = (keys, ctx)
        req = self.handle(ctx)
        self._named(keys, ctx)
        what = self.text.call("prepare_store", args)
        self._call("prepare_store", keys, ctx)
        before = {k for k, _ in self.model.tracker}
        try:
            t = self.target.prepare_store(keys, ctx)
        except Exception as e:
            raise self.raised(what, e) from e
        choose = self._adopt(what, t) if self.foreign and t is not None else None
        m = self.model.prepare_store(keys, req, self._position(ctx), choose)
        exact = not self.foreign
        self._record("prepare_store", args, self.text.store(t, exact), self.text.store(m, exact))
        if (t is None) != (m is None) or (t is not None and list(t[0]) != list(m[0])):
            raise self.diverge(
                what, self.text.store(t, exact), self.text.store(m, exact), "admitted keys differ"
            )
        if exact and t is not None and (list(t[1]) != list(m[1]) or list(t[2]) != list(m[2])):
            raise self.diverge(
                what, self.text.store(t), self.text.store(m), "chunk ids or evictions differ"
            )
        if self.model.feed == "offer":
            self.offers.offered(dict.fromkeys(keys), req, before)
        self._tracker_dirty = self.model.threshold >= 2
        self._dirty.update(keys)
        if t is not None:
            self._dirty.update(t[2])
        self._order_dirty = True
        return t

    def _adopt(self, what: str, out: Any) -> Callable:
        """The model's ``choose`` for a foreign target: the admitted keys first, then the
        target's eviction and chunk ids judged legal (spec section 9) and handed over."""
        stored, ids, victims = list(out[0]), list(out[1]), list(out[2])

        def choose(admitted: list, need: int, ok: set, free: set) -> tuple[list, list]:
            if stored != admitted:
                raise self.diverge(
                    what,
                    self.text.store(out, exact=False),
                    self.text.store((admitted, [], []), exact=False),
                    "admitted keys differ",
                )
            if len(victims) != need or len(set(victims)) != need or not set(victims) <= ok:
                raise self.diverge(
                    what,
                    self.text.store(out),
                    f"{need} distinct ready, idle "
                    f"keys outside the offer, from {self.text.keys(sorted(ok))}",
                    "illegal eviction",
                )
            usable = free | {self.model.resident[k]["chunk"] for k in victims}
            if len(ids) != len(admitted) or len(set(ids)) != len(ids) or not set(ids) <= usable:
                raise self.diverge(
                    what,
                    self.text.store(out),
                    f"{len(admitted)} distinct ids from {sorted(usable)}",
                    "illegal chunk ids",
                )
            return victims, ids

        return choose

    def complete_store(self, keys: Iterable[bytes], ctx: Any = None, success: bool = True) -> None:
        keys = list(keys)
        req = None if ctx is None else self.handle(ctx)
        self._both(
            "complete_store",
            (keys, success),
            lambda: self.target.complete_store(keys, ctx, success=success),
            lambda: self.model.complete_store(keys, success=success, req=req),
        )
        self._dirty.update(keys)
        self._order_dirty = True

    # --- whole cache
    def reset_cache(self) -> None:
        self._dirty.update(self.model.resident)
        self._both("reset_cache", (), self.target.reset_cache, self.model.reset_cache)
        self.offers.reset()
        self._replayed.clear()  # a consumer's replay starts over at a reset
        self._order_dirty = True

    def take_events(self) -> list[Any]:
        t, dated = self._both("take_events", (), self.target.take_events, self.model.take_events)
        if not getattr(self.target, "metadata_events", True):
            # An event type without metadata_only (vLLM before 0.33.0) announces no failed
            # store: those keys were never announced as stored, so the replay is the same.
            dated = [e for e in dated if not e[2]]
        if t or dated:
            self._record("take_events", (), self.text.events(t), self.text.events(dated))
        self._expect(
            "take_events",
            (),
            [tuple(e)[:3] for e in t],
            [e[:3] for e in dated],
            shown=self.text.events,
        )
        self._event_details(t, dated)
        now = self.model.generation
        for (keys, removed, *_), (_, _, _, generation, _) in zip(t, dated):
            if generation == now:  # older ones describe the cache before a reset
                (self._replayed.difference_update if removed else self._replayed.update)(keys)
        ready = {k for k, r in self.model.resident.items() if r["ref"] >= 0}
        if self.model.enable_events and self._replayed != ready:
            raise self.diverge(
                "ready keys replayed from the events",
                self.text.keys(sorted(self._replayed)),
                self.text.keys(sorted(ready)),
            )
        return t

    def _event_details(self, got: list, want: list) -> None:
        """Where the target's events name the storing request and whether the removal of the
        stored keys is expected, those too (a store event names its request, expects it)."""
        for event, (_, removed, _, _, req) in zip(got, want):
            expected = event.removal_expected
            bad = expected is not None and expected != (not removed)
            if bad and not self._known("event.removal_expected", expected, not removed, bad):
                raise self.diverge(
                    "take_events()",
                    f"removal_expected={expected} for {self.text.events([event])}",
                    f"removal_expected={not removed}",
                    "event details differ",
                )
            if expected is not None or event.req is not None:
                got_req = None if event.req is None else self.handle(event.req)
                if self._known("event.request", got_req, req if not removed else None):
                    continue
                if got_req != (req if not removed else None):
                    name = self.handles.name_of(event.req) if event.req is not None else None
                    raise self.diverge(
                        "take_events()",
                        f"request {name} for {self.text.events([event])}",
                        "the request whose store completed" if not removed else "no request",
                        "event details differ",
                    )

    def get_stats(self) -> dict[str, Any] | None:
        """The metrics, compared (spec §5.2, §5.3); ``None``, and no call on either side, where
        the target has no ``get_stats`` (vLLM before 0.24.0: the report says so)."""
        if "get_stats" in self.missing:
            return None
        t, m = self._both("get_stats", (), self.target.get_stats, self.model.get_stats)
        if t is None and self._stats_disabled():
            return None
        if t is None:
            raise self.diverge(
                "get_stats()",
                "nothing (None)",
                ", ".join(sorted(m)),
                "a get_stats() that returns nothing hides every metric"
                + (
                    " (None is 'disabled', but with store_threshold >= 2 the skip metric is due)"
                    if self.model.threshold >= 2
                    else " (it reported metrics before: they are not disabled)"
                ),
            )
        self._stats_seen = True
        if (
            m.get(STORES_SKIPPED)
            or m.get("vllm:kv_offload_cpu_allocation_size")
            or t.get(STORES_SKIPPED)
        ):
            self._record("get_stats", (), t, m)
        lacking: set[str] | frozenset[str] = set(m) - set(t)
        if self.foreign:  # the set it reported first, and the skip metric from threshold 2
            if self._metrics is None:
                self._metrics = frozenset(t)
            lacking = (self._metrics - set(t)) | (
                {STORES_SKIPPED} - set(t) if self.model.threshold >= 2 else set()
            )
        for name in sorted(lacking):
            if self._known(name, "(missing)", m.get(name)):
                continue
            raise self.diverge(
                "get_stats()",
                f"no {name}",
                f"{name}={m.get(name)}",
                f"{name} is missing: a metric is never optional by silence",
            )
        for name, value in m.items():
            if name in t and self._known(name, t[name], value, not _close(t[name], value)):
                continue
            if name in t and not _close(t[name], value):
                raise self.diverge(
                    "get_stats()", f"{name}={t[name]}", f"{name}={value}", f"{name} differs"
                )
        for name in sorted(set(t) - set(m)):
            if t[name] and not self._known(name, t[name], "(no such metric)", True):
                raise self.diverge(
                    "get_stats()",
                    f"{name}={t[name]}",
                    "(no such metric)",
                    "the target reports a metric the model does not have",
                )
        return t

    _stats_seen = False  # a get_stats() of this manager has reported metrics

    def _stats_disabled(self) -> bool:
        """Whether a ``None`` from ``get_stats()`` is the interface's documented "None if
        disabled": where no skip metric is due (store_threshold < 2, spec §5.2) and this
        manager has never reported metrics (a set that vanishes later is silence, spec
        §5.3). Then no metric is compared at this read."""
        return self.model.threshold < 2 and not self._stats_seen

    # --- retained state (spec §4.8): bounded by what the manager must hold
    def _named(self, keys: Iterable[Any], ctx: Any) -> None:
        """``ctx``'s request named ``keys`` (what the retained-state bound allows for)."""
        named = [k for k in keys if isinstance(k, bytes)]
        self._keys_named.update(named)
        if ctx is not None and not isinstance(ctx, str):
            self._named_by.setdefault(self.handle(ctx), set()).update(named)

    def retained_bound(self, held: Iterable[Any]) -> tuple[int, str]:
        """The most a manager may retain now (spec §4.8), and how it is made up; ``held``: the
        request contexts the scheduler still holds."""
        model = self.model
        built = self._built or 0
        c = model.num_chunks
        k = min(model.max_tracker_size, len(self._keys_named)) if model.threshold >= 2 else 0
        reqs = [self.handle(ctx) for ctx in held]
        r = sum(1 + len(self._named_by.get(h, ())) for h in reqs)
        q = sum(len(e[0]) for e in model.events)
        if "get_stats" not in self.missing:  # without it no sample is kept to be read
            q += len(model.samples)
        bound = built + RETAINED_FACTOR * (c + k + r + q) + RETAINED_SLACK
        return bound, (
            f"{built} as built + {RETAINED_FACTOR} x ({c} chunks + {k} tracker keys + {r} for "
            f"{len(reqs)} live requests and their keys + {q} unread event keys and samples) "
            f"+ {RETAINED_SLACK}"
        )

    def _measure(self, held: list) -> int | None:
        """The target's retained state (``oracle_retained``), or ``None`` where it cannot be
        measured (``unmeasured`` then says why)."""
        if self.unmeasured:
            return None
        manager = getattr(self.target, "manager", None)
        if manager is None:
            self.unmeasured = "its adapter shows no manager object to measure"
            return None
        skip_types = tuple(self._context_types | {type(ctx) for ctx in held})
        got = retained(
            manager, skip=(self, self.model, self.target, self.handles), skip_types=skip_types
        )
        if got.failed:
            self.unmeasured = f"measuring its state failed ({got.failed})"
            return None
        self._largest = got.largest
        return got.entries

    def check_retained(self, held: Iterable[Any]) -> int | None:
        """The target's retained state (``oracle_retained``) within ``retained_bound``; the
        entries counted, or ``None`` where it cannot be measured (``unmeasured`` says why, and
        nothing is judged: a failure to measure is never a verdict)."""
        held = list(held)
        entries = self._measure(held)
        if entries is None:
            return None
        bound, terms = self.retained_bound(held)
        if entries > bound:
            largest = ", ".join(f"{path} {n}" for path, n in self._largest)
            raise self.diverge(
                "retained state (entries of the manager's collections)",
                f"{entries} (largest: {largest})",
                f"at most {bound} = {terms}",
                "the manager's state grows with the number of calls, not with what it must "
                "hold (spec §4.8)",
            )
        return entries

    # --- whole-state checks, incremental: what changed since the last check
    def check_state(self) -> None:
        """Lookups of the keys whose residency may have changed (and, inspecting, their chunk
        id and ref count); after an offer the tracker (equal to the model's, bounded, no count
        above its offerers); for exact targets the policy's order (if it may have moved) and
        the pool."""
        for k in self._dirty:
            try:
                t = self.target.lookup(k, None)
            except Exception as e:
                raise self.raised(f"lookup({self.key_name(k)!r})", e) from e
            m = self.model.lookup(k)
            if t != m:
                raise self.diverge(f"lookup({self.key_name(k)!r})", t, m)
            if self.inspect:
                entry = self.model.resident.get(k)
                want = None if entry is None else (entry["chunk"], entry["ref"])
                got = self._inspected(f"resident({self.key_name(k)!r})", self.target.resident, k)
                if got != want:
                    raise self.diverge(f"(chunk, ref count) of {self.key_name(k)!r}", got, want)
        self._dirty.clear()
        if self._tracker_dirty:
            self._tracker_dirty = False
            self._check_tracker(self._inspected("the tracker", self.target.tracker_items))
        if self.foreign or not self._order_dirty:
            return
        self._order_dirty = False
        free = self._inspected("the pool's free chunks", self.target.free_chunks)
        if free is not None and free + len(self.model.resident) != self.model.num_chunks:
            raise self.diverge(
                "free chunks + resident chunks",
                free + len(self.model.resident),
                self.model.num_chunks,
            )
        order = self._inspected("the policy's order", self.target.policy_state)
        if order is not None:
            model_order = self.model.policy_state()
            if order != model_order:
                raise self.diverge(
                    "policy order (least recent first)",
                    self.text.policy(order),
                    self.text.policy(model_order),
                )

    def _inspected(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """What the adapter reads of the target's state (spec §9's inspection): a state it
        cannot read as the interface's types say (``BadAnswer``) is the target's divergence;
        anything else raised is judged as a call's would be (``raised``)."""
        try:
            return fn(*args)
        except TargetError:
            raise
        except Exception as e:
            raise self.raised(what, e, "(inspected, not asked of the model)") from e

    def _check_tracker(self, got: list | None) -> None:
        want = self.model.tracker_items()
        if got is None and not want:
            return
        got = [tuple(x) for x in got or ()]
        if len(got) > self.model.max_tracker_size:
            raise self.diverge(
                "tracker size",
                len(got),
                self.model.max_tracker_size,
                "the tracker holds more keys than max_tracker_size",
            )
        for k, n in got:  # independent of the model: the offers this oracle saw
            offerers = self.offers.since_entry(k)
            if n > offerers:
                raise self.diverge(
                    f"tracker count of {self.key_name(k)!r}",
                    n,
                    f"at most {offerers}",
                    "a count exceeds the distinct requests that "
                    + ("looked the key up" if self.model.feed == "lookup" else "offered the key")
                    + " since it entered the tracker",
                )
        if got != want:
            raise self.diverge(
                "tracker (key, count), least recent first",
                self.text.tracker(got),
                self.text.tracker(want),
            )

    # --- bad input: a clear error, and nothing changes
    def refuse(
        self, name: str, args: tuple, fn: Callable[[], Any], key: Any, call: str | None = None
    ) -> None:
        """``fn`` (a call the model refuses) must raise an error that names ``key`` (and
        ``call``, the call refused, where given) and leave the target's state as it was (exact
        targets only: an adapter cannot show it all)."""
        self._call(name, *args)
        what = self.text.call(name, args)
        keys = list(self.model.resident) + [k for k, _ in self.model.tracker]
        before = self._snapshot(keys)
        try:
            fn()
        except Exception as exc:  # any clear error naming the key
            text = str(exc)
            if repr(key) not in text and str(self.key_name(key)) not in text:
                raise self.diverge(
                    what, f"an error that does not name the key: {exc}", "an error naming the key"
                ) from None
            if call is not None and not re.search(rf"\b{call}\b", text):
                raise self.diverge(
                    what, f"an error that does not name the call: {exc}", f"an error naming {call}"
                ) from None
        else:
            raise self.diverge(what, "accepted", "refused")
        after = self._snapshot(keys)
        if after != before:
            raise self.diverge(f"state after the refused {what}", after, before)

    def _snapshot(self, keys: list[bytes]) -> tuple:
        return (
            [self.target.lookup(k, None) for k in keys],
            self.target.tracker_items(),
            self.target.policy_state(),
            self.target.free_chunks(),
            [self.target.resident(k) for k in keys],
        )
