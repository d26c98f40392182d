"""The manager-vs-model state machine: any target and the model, in lockstep.

Each rule draws one step (an offer, a retry, a re-offer after preemption, a completion, a
load, a reset, ...), applies it to the target and to the model, and compares every answer the
model fixes. Invariants check the whole state after every step. Keys are named by letters
(``'A'`` .. ``'F'``) so that a shrunk counterexample reads like the story it tells.

For a foreign target (SPEC section 9) the model checks that each eviction and chunk-id choice
is legal and adopts it; everything the admission rule fixes is still compared exactly.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from hypothesis import event, strategies as st
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, precondition, rule)

from kvgate.impl.base import make_key
from kvgate.model.cache import AdmissionDiffers, Model, ModelError

from .targets import Target

KEY_NAMES = "ABCD"
KEYS = {name: make_key(name.encode()) for name in KEY_NAMES}
REQ_IDS = ("r0", "r1", "r2")
LABELS = ("retry after None", "re-offer after preemption", "offer across a reset",
          "tracker full", "eviction", "failed store")
# Properties that need what an adapter of a foreign manager cannot see or fix.
EXACT_ONLY = ("chunk ids equal the model's", "evicted keys equal the model's",
              "policy order equals the model's",
              "pool accounting", "bad input leaves state unchanged",
              "repeated keys in one offer")


def name_of(key: bytes) -> str:
    try:
        return key[:-4].decode()
    except Exception:  # not one of ours
        return repr(key)


def names(keys) -> list[str]:
    return [name_of(k) for k in keys]


class Divergence(AssertionError):
    """The target answered differently from the model (or broke an invariant)."""


@dataclass(eq=False)
class Req:
    """A request handle: its context on the target, its handle in the model."""

    n: int
    req_id: str
    ctx: object
    generation: int
    offered: list = field(default_factory=list)  # keys in first-offer order
    last_offer: list | None = None
    last_failed: bool = False

    def __repr__(self) -> str:
        return f"<request {self.req_id}#{self.n}>"


@dataclass(eq=False)
class Job:
    """An in-flight store or load, stale after a reset."""

    keys: list
    req: Req | None
    generation: int
    done: bool = False

    def __repr__(self) -> str:
        return f"<job {names(self.keys)}>"


class ManagerMachine(RuleBasedStateMachine):
    TARGET: Target  # set by make_machine
    labels_seen: Counter = Counter()  # coverage labels over every run of this class
    last_history: list = []

    requests = Bundle("requests")
    stores = Bundle("stores")
    loads = Bundle("loads")

    def __init__(self):
        super().__init__()
        self.history: list[dict] = []
        self.target = None

    # --- set-up ---

    def _configure(self, num_chunks, store_threshold, max_tracker_size, policy):
        self.config = dict(num_chunks=num_chunks, cache_policy=policy,
                           store_threshold=store_threshold, max_tracker_size=max_tracker_size)
        self.target = self.TARGET.make(num_chunks, policy, store_threshold, max_tracker_size)
        self.model = Model(num_chunks, policy, store_threshold, max_tracker_size)
        self.foreign = self.TARGET.foreign
        self.generation = 0
        self.n_requests = self.alive = 0
        self.in_flight: list[Job] = []
        self.offered_by: dict[bytes, set] = defaultdict(set)  # key -> {(req, generation)}
        self.replayed: set[bytes] = set()  # ready keys, from the target's events
        self.loader = self.target.new_context("loader")
        self._log("configure", self.config, None, None)

    def _log(self, call, args, target, model):
        self.history.append({"step": len(self.history), "call": call, "args": args,
                             "target": target, "model": model})

    def _label(self, label):
        if currently_in_test_context():  # a printed program may run outside Hypothesis
            event(label)
        type(self).labels_seen[label] += 1

    def _expect(self, what, target, model):
        if target != model:
            raise Divergence(f"{what}: target answered {target!r}, model answered {model!r}")

    def teardown(self):
        type(self).last_history = self.history

    # --- requests and offers ---

    @precondition(lambda self: self.alive < 3)
    @rule(target=requests, req_id=st.sampled_from(REQ_IDS))
    def start_request(self, req_id):
        self.n_requests += 1
        self.alive += 1
        req = Req(self.n_requests, req_id, self.target.new_context(req_id), self.generation)
        self.target.on_new_request(req.ctx)
        self._log("start_request", {"req": repr(req)}, None, None)
        return req

    @rule(target=stores, req=requests,
          key_names=st.lists(st.sampled_from(KEY_NAMES), min_size=1, max_size=4))
    def offer(self, req, key_names):
        keys = [KEYS[n] for n in key_names]
        if self.foreign:  # upstream managers do not deduplicate; the scheduler never repeats
            keys = list(dict.fromkeys(keys))
        elif len(set(keys)) < len(keys):
            self._label("repeated key in one offer")
        return self._offer(req, keys)

    @rule(target=stores, req=requests)
    def retry(self, req):
        """The scheduler's next step offers the same keys again through the same context."""
        if req.last_offer is None:
            return multiple()
        if req.last_failed:
            self._label("retry after None")
        return self._offer(req, req.last_offer)

    @rule(target=stores, req=requests)
    def preempt_and_resume(self, req):
        """A resumed request re-offers its keys from the first chunk, same context."""
        if not req.offered:
            return multiple()
        self._label("re-offer after preemption")
        return self._offer(req, list(req.offered))

    def _offer(self, req, keys):
        if req.offered and req.generation < self.generation:
            self._label("offer across a reset")
            req.generation = self.generation
        got = self.target.prepare_store(keys, req.ctx)
        what = f"prepare_store({names(keys)}, {req!r})"
        if got is None or not self.foreign:
            want = self.model.prepare_store(keys, req.n)
        else:
            try:
                want = self.model.prepare_store(keys, req.n, choice=(got[2], got[1]),
                                                stored=got[0])
            except AdmissionDiffers as exc:  # the admission differs, not the choice
                want = {"store": names(exc.admitted)}
                self._log("prepare_store", {"req": repr(req), "keys": names(keys)},
                          self._show(got, exact=False), want)
                raise Divergence(f"{what}: admitted keys differ: target answered "
                                 f"{self._show(got, exact=False)}, model answered {want}") from None
            except ModelError as exc:
                self._log("prepare_store", {"req": repr(req), "keys": names(keys)},
                          self._show(got), str(exc))
                raise Divergence(f"{what}: target answered {self._show(got)}, "
                                 f"which the model rejects: {exc}") from None
        self._log("prepare_store", {"req": repr(req), "keys": names(keys)},
                  self._show(got), self._show(want))
        self._expect(what, self._show(got, exact=not self.foreign),
                     self._show(want, exact=not self.foreign))
        for key in dict.fromkeys(keys):
            self.offered_by[key].add((req.n, self.generation))
            if key not in req.offered:
                req.offered.append(key)
        req.last_offer, req.last_failed = keys, got is None
        if got is not None and got[2]:
            self._label("eviction")
        tracked = self.model.tracker_items()
        if self.model.threshold >= 2 and len(tracked) >= self.model.max_tracker_size:
            self._label("tracker full")
        if got is None or not got[0]:
            return multiple()
        job = Job(list(got[0]), req, self.generation)
        self.in_flight.append(job)
        return job

    @staticmethod
    def _show(answer, exact=True):
        if answer is None:
            return None
        stored, ids, evicted = answer
        if not exact:
            return {"store": names(stored)}
        return {"store": names(stored), "chunks": list(ids), "evicted": names(evicted)}

    @precondition(lambda self: self.alive > 1)
    @rule(req=consumes(requests))
    def finish(self, req):
        self.alive -= 1
        self.target.on_request_finished(req.ctx)
        self._log("finish", {"req": repr(req)}, None, None)

    # --- store completions, loads, touches ---

    def _stale(self, job):
        if job.done:
            return True
        if job.generation != self.generation:
            self._label("stale completion dropped")
            return True
        return False

    @rule(job=consumes(stores), success=st.sampled_from([True, True, False]))
    def complete_store(self, job, success):
        if self._stale(job):
            return
        self._complete(job, success)

    @precondition(lambda self: self.in_flight)
    @rule()
    def flush_stores(self):
        """Every store in flight completes, as when the scheduler waits for its jobs."""
        for job in list(self.in_flight):
            self._complete(job, True)

    def _complete(self, job, success):
        if not success:
            self._label("failed store")
        job.done = True
        self.in_flight.remove(job)
        self.target.complete_store(job.keys, job.req.ctx, success=success)
        self.model.complete_store(job.keys, success)
        self._log("complete_store", {"keys": names(job.keys), "success": success}, None, None)

    def _any(self, *states):
        return any(self.model.lookup(k) in states for k in KEYS.values())

    @precondition(lambda self: self._any("HIT"))
    @rule(target=loads, key_names=st.lists(st.sampled_from(KEY_NAMES), min_size=1, max_size=3))
    def load(self, key_names):
        keys = [KEYS[n] for n in dict.fromkeys(key_names) if self.model.lookup(KEYS[n]) == "HIT"]
        if not keys:
            return multiple()
        got, want = self.target.prepare_load(keys, self.loader), self.model.prepare_load(keys)
        self._log("prepare_load", {"keys": names(keys)}, got, want)
        self._expect(f"prepare_load({names(keys)}) chunk ids", got, want)
        return Job(keys, None, self.generation)

    @rule(job=consumes(loads))
    def complete_load(self, job):
        if self._stale(job):
            return
        self.target.complete_load(job.keys, self.loader)
        self.model.complete_load(job.keys)
        self._log("complete_load", {"keys": names(job.keys)}, None, None)

    @precondition(lambda self: self._any("HIT", "HIT_PENDING"))
    @rule(key_names=st.lists(st.sampled_from(KEY_NAMES), min_size=1, max_size=4, unique=True))
    def touch(self, key_names):
        keys = [KEYS[n] for n in key_names]
        self.target.touch(keys, self.loader)
        self.model.touch(keys)
        self._log("touch", {"keys": key_names}, None, None)

    @precondition(lambda self: self._any("HIT", "HIT_PENDING"))
    @rule()
    def reset(self):
        self.target.reset_cache()
        self.model.reset_cache()
        self.generation += 1
        self.in_flight.clear()
        self.replayed.clear()
        self._log("reset_cache", {}, None, None)

    def _stats_agree(self):
        got, want = self.target.get_stats(), self.model.get_stats()
        if want.get("vllm:kv_offload_stores_skipped") or want.get(
                "vllm:kv_offload_cpu_allocation_size"):
            self._log("get_stats", {}, got, want)
        self._compare_stats(got, want)

    def _compare_stats(self, got, want):
        for name, value in want.items():
            if got.get(name) is None and self.foreign:
                continue  # an adapter that cannot see this metric
            other = got.get(name)
            if isinstance(value, float):
                ok = isinstance(other, (int, float)) and math.isclose(other, value, abs_tol=1e-9)
            else:
                ok = other == value
            if not ok:
                raise Divergence(f"get_stats()[{name!r}]: target answered {other!r}, "
                                 f"model answered {value!r}")
        if "vllm:kv_offload_stores_skipped" in got and "vllm:kv_offload_stores_skipped" \
                not in want and got["vllm:kv_offload_stores_skipped"]:
            raise Divergence("get_stats(): target reports skips with store_threshold < 2")

    # --- bad input: a clear error and no change ---

    def _snapshot(self):
        return ([self.target.lookup(k, self.loader) for k in KEYS.values()],
                self.target.tracker_items())

    def _expect_refusal(self, call, fn, key):
        before = self._snapshot()
        try:
            fn()
        except Exception as exc:  # any clear error naming the key
            if repr(key) not in str(exc) and name_of(key) not in str(exc):
                raise Divergence(f"{call}: the error does not name the key: {exc}") from None
        else:
            raise Divergence(f"{call}: target accepted it, model refuses it")
        self._expect(f"state after refused {call}", self._snapshot(), before)
        self._log(call, {}, "refused", "refused")
        self._compare_stats(self.target.get_stats(), self.model.get_stats())

    @precondition(lambda self: self._any("HIT", "HIT_PENDING"))
    @rule(req=requests, kind=st.sampled_from(["prepare_load", "complete_load", "key type"]),
          good=st.lists(st.sampled_from(KEY_NAMES), max_size=2), bad=st.sampled_from(KEY_NAMES))
    def bad_input(self, req, kind, good, bad):
        """A protocol error: the target must refuse it, name the key, and change nothing."""
        if self.foreign:
            return
        key = KEYS[bad]
        if kind == "prepare_load" and self.model.lookup(key) != "HIT":
            keys = [KEYS[n] for n in good if self.model.lookup(KEYS[n]) == "HIT"] + [key]
            self._expect_refusal(f"prepare_load({names(keys)})",
                                 lambda: self.target.prepare_load(keys, self.loader), key)
        elif kind == "complete_load" and self.model.resident.get(key, {"ref": 0})["ref"] <= 0:
            self._expect_refusal(f"complete_load([{bad!r}])",
                                 lambda: self.target.complete_load([key], self.loader), key)
        elif kind == "key type":
            keys = [KEYS[n] for n in good] + ["not-bytes"]
            self._expect_refusal(f"prepare_store({names(keys[:-1]) + ['not-bytes']})",
                                 lambda: self.target.prepare_store(keys, req.ctx), "not-bytes")

    # --- invariants ---

    @invariant()
    def agrees_with_model(self):
        """After every step: events, stats, tracker, residency and policy order agree."""
        if self.target is None:
            return
        self._events_replay_to_ready_keys()
        self._stats_agree()
        self._tracker_agrees_and_is_bounded()
        self._residency_agrees()

    def _events_replay_to_ready_keys(self):
        got, want = self.target.take_events(), self.model.take_events()
        if got or want:
            self._log("take_events", {}, [(names(k), r, m) for k, r, m in got],
                      [(names(k), r, m) for k, r, m in want])
        self._expect("take_events()", [(names(k), r, m) for k, r, m in got],
                     [(names(k), r, m) for k, r, m in want])
        for keys, removed, _ in got:
            if removed:
                self.replayed.difference_update(keys)
            else:
                self.replayed.update(keys)
        ready = {k for k, r in self.model.resident.items() if r["ref"] >= 0}
        self._expect("ready keys replayed from events", sorted(names(self.replayed)),
                     sorted(names(ready)))

    def _tracker_agrees_and_is_bounded(self):
        got = self.target.tracker_items()
        want = self.model.tracker_items()
        if got is not None or want:
            self._expect("tracker (key, count), least recent first",
                         [(name_of(k), c) for k, c in (got or [])],
                         [(name_of(k), c) for k, c in want])
        got = got or []
        if len(got) > self.model.max_tracker_size:
            raise Divergence(f"tracker holds {len(got)} keys, more than max_tracker_size "
                             f"{self.model.max_tracker_size}")
        for key, count in got:  # independent of the model: the offers this run made
            if count > len(self.offered_by[key]):
                raise Divergence(f"tracker count of {name_of(key)!r} is {count}, but only "
                                 f"{len(self.offered_by[key])} request(s) offered it")

    def _residency_agrees(self):
        for name, key in KEYS.items():
            self._expect(f"lookup({name!r})", self.target.lookup(key, self.loader),
                         self.model.lookup(key))
        if self.foreign:
            return
        free = self.target.free_chunks()
        if free is not None:
            used = len(self.model.resident)
            self._expect("free chunks + resident chunks", free + used, self.model.num_chunks)
        for key, r in self.model.resident.items():
            self._expect(f"chunk of {name_of(key)!r}", self.target.chunk_of(key), r["chunk"])
        order = self.target.policy_state()
        if order is not None:
            m = self.model
            want = {"lru": m.lru} if m.policy == "lru" else {
                "t1": m.t1, "t2": m.t2, "b1": m.b1, "b2": m.b2, "p": m.p}
            show = lambda st: {k: v if k == "p" else names(v) for k, v in st.items()}  # noqa
            self._expect("policy order (least recent first)", show(order), show(want))


def machine_name(kind: str, spec: str) -> str:
    """A class name that is a valid identifier, so the printed program runs as it stands."""
    return kind + "_" + "".join(c if c.isalnum() else "_" for c in spec)


def make_machine(target: Target, policies: tuple[str, ...] | None = None):
    """A machine class checking ``target`` under the given policies (default: the target's)."""
    policies = tuple(policies or target.policies)

    class Machine(ManagerMachine):
        TARGET = target
        labels_seen = Counter()

        @initialize(target=ManagerMachine.requests, num_chunks=st.integers(1, 4),
                    store_threshold=st.sampled_from([2, 1, 2, 1, 3, 0, 4]),
                    max_tracker_size=st.integers(1, 6),
                    policy=st.sampled_from(policies))
        def configure(self, num_chunks, store_threshold, max_tracker_size, policy):
            """Build target and model; two requests run from the start, so offers can
            begin at step one."""
            self._configure(num_chunks, store_threshold, max_tracker_size, policy)
            return multiple(self.start_request("r0"), self.start_request("r1"))

    Machine.__name__ = Machine.__qualname__ = machine_name("ManagerMachine", target.spec)
    return Machine
