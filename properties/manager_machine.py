"""The manager-vs-model state machine: any target and the model in lockstep, through the oracle.

Each rule draws one step (an offer, a retry, a re-offer after preemption, a finish, a
completion, a load, a lookup, a reset, a read of the stats or the events, ...) and hands it to
the oracle (``properties.oracle.LockstepManager``), which applies it to the target and to the
model and compares every answer the model fixes; the invariant is the oracle's incremental
check of what the step changed. Keys are letters (``'A'`` .. ``'D'`` in KV-cache group 0,
``'E'`` and ``'F'`` in group 1) and requests are named as Hypothesis names them
(``requests_1``), so a shrunk counterexample reads like the story it tells. For a foreign
target (spec section 9) the oracle checks each eviction and chunk-id choice for legality and
adopts it; everything the admission rule fixes is compared exactly.

The manager's whole contract, not one scheduler's habits (spec section 2):

- **Every configuration the target accepts**: 1 to 5 chunks, thresholds 0 to 4, trackers of 1
  to 6 keys or a large one, both policies, both recency semantics where the target can be built
  with either, events switched on or off, and where the target takes vLLM's
  ``cache_policy_module_path``, the policy named the out-of-tree way (class and module) as well
  as by its registered name. Beside each example's managers, an exact target is also built with
  no chunks and its stats are read with every ``read_stats``. A constructor that raises on a
  configuration the model accepts is a counterexample.
- **Positions.** Each request gives its keys positions (``ReqContext``'s end tokens) in one of
  several layouts: in the order it first offers or loads them (as a scheduler computes a
  prefix), alphabetical (group 1 sharing group 0's positions), reversed, only some keys, or
  none. Request-scoped recency (spec R1-R7) orders by them.
- **Loads by requests**, with or without a preceding ``touch`` where the target has one;
  lookups (and ``get_load_source`` for a hit), stats, events and the interface answers read at
  any point; finishes and resets at any point.
- **Contexts that come and go.** A finished request's context is dropped as soon as no job of
  it is in flight, and freed when the next request starts, right before its context is made,
  so the new context takes the dead one's memory and ``id`` (``properties/contexts.py``): a
  manager that keys its records by ``id(ctx)`` meets a stranger's records.
- **Two manager instances** (when ``instances=2``): ``switch_manager`` moves every later step
  to a new manager, and the live request contexts go with it (spec A7: records are tied to their
  manager). Never back: a context's scratch store holds one record per type (spec section 1),
  so a manager that ties its record to itself replaces the other's (impl and vLLM both do); the
  two models share one table of records (``Model.slots``) to follow that.
- **Pressure**: offers of 1 to 4 distinct keys need several victims; pinned and pending chunks.
- **Swarm testing** (Groce et al., ISSTA 2012) and weighted rules
  (``search/rule_choice.py``), and ``hypothesis.target`` towards victims per offer, pinned
  chunks, tracker push-outs, and the two rarest decisions (a metadata-only removal filtered at
  the drain, a skip of a key the request had admitted: 0.34.0's defect lives there) with the
  states just before them (admitted keys lost and still wanted, stale records over resident
  keys).
- **The spec's named cases as steps**: ``reoffer_lost`` re-offers the keys a request had
  admitted and lost once the tracker let them go (spec A5), drawn only when there are some.
- **Long runs in one step**: an example's first ``load`` repeats its touch, load and unload,
  and its first ``touch`` its touch of the resident keys, as many times per key as the
  retained-state bound allows entries (``_long_run``), so that anything kept per call
  outgrows it in one step; after every load and touch, and at the end of every example, each
  manager's retained state must be within spec §4.8's bound
  (``LockstepManager.check_retained``), which a lazy structure that never compacts outgrows
  while every answer stays right. The repeats change nothing the model sees, so they draw
  nothing and move no other example.
- **Nothing unread at the end**: after the last step that passed, the metrics and events no
  step read are read (spec §5.1, §5.3), so a swarm that switched those reads off still sees a
  miscounted metric or a missing event. So every catalogued variant is caught at the ``ci``
  budget users run (``CI=true kvgate mutants``), not only at a larger one.

Coverage labels count decisions taken in a step (an eviction attempted while T1 had no idle
victim, a key refused by a full tracker, a commit that moved a key), not states passed through.
Draws are cheap: an offer is one integer into a table of every offer (``OFFERS``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from itertools import permutations

from hypothesis import strategies as st
from hypothesis import target as hypothesis_target
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from kvgate.impl.base import make_key
from kvgate.model.cache import Model

from .adapters import Config, Target, model_for
from .contexts import Contexts
from .offers import Handles
from .oracle import EXACT_ONLY, LockstepManager, build
from .search.coverage import Recorded
from .search.rule_choice import install as install_rule_choice

__all__ = [
    "EXACT_ONLY",
    "KEYS",
    "LABELS",
    "ManagerMachine",
    "OFFERS",
    "make_machine",
    "machine_name",
]

KEY_NAMES = "ABCDEF"
GROUP_OF = {"A": 0, "B": 0, "C": 0, "D": 0, "E": 1, "F": 1}
KEYS = {name: make_key(name.encode(), GROUP_OF[name]) for name in KEY_NAMES}
REQ_IDS = ("r0", "r1", "r2")  # requests alive at any time, one per id
TOKENS_PER_KEY = 16
# How a request places its keys (end tokens), spec R3: "prefix" gives each key the next
# position when the request first offers or loads it; the others are fixed at its start.
LAYOUTS = ("prefix", "alphabetical", "reversed", "some", "none")
FIXED = {
    "alphabetical": {"A": 1, "B": 2, "C": 3, "D": 4, "E": 1, "F": 2},
    "reversed": {"A": 6, "B": 5, "C": 4, "D": 3, "E": 2, "F": 1},
    "some": {"A": 2, "B": 1, "E": 3},
    "none": {},
}
layouts = st.integers(0, len(LAYOUTS) - 1).map(lambda i: LAYOUTS[i])


# How often an offer of n distinct keys is drawn, relative to one of 4 (about 8% offers of one
# key, 21% of two, 28% of three, 42% of four, then a few that repeat a key).
LENGTH_WEIGHTS = {1: 12, 2: 6, 3: 2, 4: 1}


def _offers() -> tuple[tuple[str, ...], ...]:
    """Every offer of 1 to 4 distinct keys, shortest and earliest letters first (so shrinking
    goes there), each as often as ``LENGTH_WEIGHTS`` says; then offers that repeat a key (only
    kvgate-interface targets receive those)."""
    distinct = [p for n in range(1, 5) for p in permutations(KEY_NAMES, n)]
    repeated = [p + (p[0],) for p in distinct if len(p) <= 3]
    return tuple([p for p in distinct for _ in range(LENGTH_WEIGHTS[len(p)])] + repeated)


OFFERS = _offers()
N_DISTINCT = sum(1 for o in OFFERS if len(set(o)) == len(o))
N_SHORT = sum(1 for o in OFFERS[:N_DISTINCT] if len(o) <= 3)
offer_keys = st.integers(0, len(OFFERS) - 1).map(lambda i: list(OFFERS[i]))
distinct_keys = st.integers(0, N_DISTINCT - 1).map(lambda i: list(OFFERS[i]))
some_keys = st.integers(0, N_SHORT - 1).map(lambda i: list(OFFERS[i]))  # 1 to 3 keys
BAD_CALLS = tuple(
    (kind, list(good), bad)
    for kind in ("prepare_load", "complete_load", "key type", "context")
    for bad in KEY_NAMES
    for good in dict.fromkeys(o for o in OFFERS if len(o) <= 2)
    if bad not in good
)
bad_calls = st.integers(0, len(BAD_CALLS) - 1).map(lambda i: BAD_CALLS[i])
# Configurations the model refuses; a kvgate-interface target must too, naming the parameter.
BAD_CONFIGS = (
    ("num_chunks", -1),
    ("num_chunks", "2"),
    ("store_threshold", -1),
    ("max_tracker_size", 0),
    ("cache_policy", "nope"),
)
BAD_RECENCY = (("recency", "sideways"),)  # only for a factory that is told the recency
LARGE_TRACKER = 64_000


def name_of(key: bytes) -> str:
    try:
        return key[:-4].decode()
    except Exception:  # not one of ours
        return repr(key)


def _offer_facts(e: dict) -> bool:
    return e["rule"] in ("offer", "retry", "preempt_and_resume", "reoffer_lost")


LABELS = {
    "retry after None": lambda e: e["rule"] == "retry" and e.get("after_none", False),
    "re-offer after preemption": lambda e: e["rule"] == "preempt_and_resume",
    "offer across a reset": lambda e: e.get("across_reset", False),
    "key refused by a full tracker": lambda e: e.get("refused_by_tracker", False),
    "tracker push-out": lambda e: e.get("pushed_out", False),
    "eviction": lambda e: e.get("victims", 0) >= 1,
    "multi-victim eviction": lambda e: e.get("victims", 0) >= 2,
    "offer refused (None)": lambda e: _offer_facts(e) and e.get("none", False),
    "failed store": lambda e: e["rule"] == "complete_store" and not e["success"],
    "stale completion dropped": lambda e: e.get("stale", False),
    "load after touch": lambda e: e["rule"] == "load" and e.get("touched", False),
    "load without touch": lambda e: e["rule"] == "load" and not e.get("touched", False),
    "touch": lambda e: e["rule"] == "touch",
    "lookup of a hit": lambda e: e["rule"] == "lookup" and e.get("hit", False),
    "repeated key in one offer": lambda e: e.get("repeated", False),
    "context dropped": lambda e: e.get("dropped", False),
    "context identity reused": lambda e: e.get("id_reused", False),
    "offer to a second manager with a shared context": lambda e: e.get("shared", False),
    "stats read across a reset with unreported stats": lambda e: e.get("unreported", False),
    "metadata-only removal filtered at drain": lambda e: e.get("filtered", False),
    "skip of a key the request had admitted": lambda e: e.get("skip_after_admit", False),
    "eviction needed while T1 has no idle victim and T2 a pinned key": lambda e: e.get(
        "t2_pinned", False
    ),
    "bad input refused": lambda e: e["rule"] == "bad_input" and e.get("refused", False),
    "configuration with events off": lambda e: e["rule"] == "configure" and not e["enable_events"],
    "configuration with a large tracker": lambda e: (
        e["rule"] == "configure" and e["max_tracker_size"] == LARGE_TRACKER
    ),
    # request-scoped recency (spec R1-R7)
    "commit at finish moved a key": lambda e: e["rule"] == "finish" and e.get("moved", False),
    "commit of keys in two groups": lambda e: e["rule"] == "finish" and e.get("groups", 0) > 1,
    "commit in first-sight order (a key without a position)": lambda e: (
        e["rule"] == "finish" and e.get("moved", False) and e.get("unplaced", False)
    ),
    "first sight lifted a rank": lambda e: e.get("lifted", False),
    "reuse promoted to T2 at finish": lambda e: e["rule"] == "finish" and e.get("promoted", False),
    "swarm: rules switched off": lambda e: e["rule"] == "swarm" and bool(e["off"]),
}
KVGATE_INTERFACE_ONLY = ("repeated key in one offer", "bad input refused")
REQUEST_ONLY = (
    "commit at finish moved a key",
    "commit of keys in two groups",
    "commit in first-sight order (a key without a position)",
    "first sight lifted a rank",
    "reuse promoted to T2 at finish",
)
ARC_ONLY = (
    "eviction needed while T1 has no idle victim and T2 a pinned key",
    "reuse promoted to T2 at finish",
)
LRU_ONLY = ("first sight lifted a rank",)


@dataclass(eq=False)
class Req:
    """A request handle: its context (``None`` once dropped) and what it did."""

    n: int
    req_id: str
    ctx: object
    layout: str = "none"
    offered: list = field(default_factory=list)  # keys in first-offer order
    placed: int = 0  # "prefix" layout: positions handed out so far
    last_offer: list | None = None
    last_failed: bool = False
    since: dict = field(default_factory=dict)  # instance -> generation of its first offer
    admitted: dict = field(default_factory=dict)  # (instance, generation) -> keys admitted
    in_flight: int = 0  # stores and loads in flight
    finished: bool = False

    def __repr__(self) -> str:
        return f"requests_{self.n}"  # Hypothesis's name for it in a printed program


@dataclass(eq=False)
class Job:
    """An in-flight store or load on one manager instance, stale after its reset."""

    keys: list
    req: Req
    inst: int
    generation: int
    done: bool = False

    def __repr__(self) -> str:
        return f"<job {[name_of(k) for k in self.keys]}>"


class ManagerMachine(Recorded, RuleBasedStateMachine):
    TARGET: Target  # set by make_machine
    POLICIES: tuple[str, ...]
    LABELS = LABELS
    # How the next rule is picked (properties/search/rule_choice.py): offers weigh most, and the
    # first rules are where shrinking goes.
    RULE_WEIGHTS = {
        "offer": 4,
        "retry": 2,
        "preempt_and_resume": 2,
        "complete_store": 2,
        "fail_store": 1,
        "flush_stores": 1,
        "read_stats": 1,
        "take_events": 2,
        "finish": 2,
        "reset": 1,
        "load": 2,
        "complete_load": 1,
        "touch": 1,
        "lookup": 1,
        "switch_manager": 1,
        "bad_input": 1,
        "reoffer_lost": 4,
    }
    SWARM_ALWAYS = ("offer",)
    clean = False  # the latest step and its checks passed (teardown's final reads)

    requests = Bundle("requests")
    stores = Bundle("stores")
    loads = Bundle("loads")

    def __init__(self):
        super().__init__()
        self.history: list[dict] = []
        self.oracles: list[LockstepManager] = []
        install_rule_choice(self)

    @classmethod
    def expected_labels(cls) -> tuple[str, ...]:
        target = cls.TARGET
        skip = (
            set(KVGATE_INTERFACE_ONLY) if target.foreign or not target.kvgate_interface else set()
        )
        if "reset_cache" in target.missing:  # never drawn (spec §10: 0.21.0 has none)
            skip.update(("offer across a reset", "stats read across a reset with unreported stats"))
        if "get_stats" in target.missing:
            skip.add("stats read across a reset with unreported stats")
        if "touch" in target.missing:  # T2 fills only by reuse at finish: rarely pinned then
            skip.update(
                (
                    "touch",
                    "load after touch",
                    "eviction needed while T1 has no idle victim and T2 a pinned key",
                )
            )
        if "request" not in target.recencies:
            skip.update(REQUEST_ONLY)
        if "arc" not in cls.POLICIES:
            skip.update(ARC_ONLY)
        if "lru" not in cls.POLICIES:
            skip.update(LRU_ONLY)
        if target.foreign:  # its policy is its own: the model's order says nothing about it
            skip.update(REQUEST_ONLY + ARC_ONLY)
        return tuple(label for label in LABELS if label not in skip)

    # --- set-up ---

    def _configure(self, config: Config, instances: int, layouts: list[str]):
        self.config = config
        self.foreign = self.TARGET.foreign
        self.exact_interface = self.TARGET.kvgate_interface and not self.foreign
        self.can_touch = "touch" not in self.TARGET.missing
        self.can_reset = "reset_cache" not in self.TARGET.missing  # vLLM 0.21.0 has none
        self.record("configure", **config.__dict__, instances=instances)
        self.handles = Handles()
        slots: dict = {}  # one record per request, whichever manager took it (Model.slots)
        for _ in range(instances):
            # slots: where the target's tracker counts (spec §3.2)
            model = model_for(config, slots=slots, feed=self.TARGET.feed)
            adapter = build(self.TARGET, config, model)
            self.oracles.append(
                LockstepManager(
                    adapter,
                    model,
                    foreign=self.foreign,
                    log=self.history,
                    key_name=name_of,
                    handles=self.handles,
                )
            )
        self.active = 0
        self.generations = [0] * instances
        self.steps = self.n_requests = 0
        self.live: list[Req] = []
        self.in_flight: list[Job] = []
        self.dead_ids: set[int] = set()  # ids of dropped contexts
        self._dropped: list = []  # dropped contexts, freed when the next request starts
        self.contexts = Contexts(self.oracles[0].new_context)
        self.unreported_reset = [False] * instances
        self.max_victims = self.max_pinned = self.pushouts = 0
        self.long_runs: set[str] = set()  # the kinds of step that made their long run
        self.rare = 0  # filtered metadata-only removals and skips of admitted keys
        # the states just before the two rarest defects: lost admitted keys (spec A5) and stale
        # records over resident keys (spec R3); the search climbs towards them
        self.lost = self.stale = 0
        self.clean = False  # set by the invariant after each step that passed
        # exact targets: a twin with no chunks (a size a release accepts, and the one where
        # its usage gauges must not divide by zero), read with the stats
        self.empty = None if self.foreign else self._empty_twin(config)
        if self.exact_interface:
            self._check_construction(config)
        return multiple(
            *(self._new_request(req_id, layout)[0] for req_id, layout in zip(REQ_IDS, layouts))
        )

    def _empty_twin(self, config: Config) -> LockstepManager:
        """The target and the model built as ``config`` says but with no chunks."""
        empty = dataclasses.replace(config, num_chunks=0)
        model = model_for(empty)
        return LockstepManager(build(self.TARGET, empty, model), model, key_name=name_of)

    def _check_construction(self, config: Config):
        """A kvgate-interface target keeps the configuration it was given and refuses a bad
        configuration (as the model does) with an error that names it (spec section 8)."""
        t = self.oracles[0].target.manager
        told = ("recency",) if self.TARGET.takes_recency else ()  # what its factory is given
        for attr in ("store_threshold", "cache_policy", *told):
            got, want = getattr(t, attr, getattr(config, attr)), getattr(config, attr)
            assert got == want, f"target's {attr} is {got!r}, built with {want!r}"
        good = dict(config.__dict__, num_chunks=1)
        for name, value in BAD_CONFIGS + tuple((n, v) for n, v in BAD_RECENCY if n in told):
            bad = Config(**{**good, name: value})
            try:
                model_for(bad)
            except ValueError:
                pass
            else:  # pragma: no cover - the table is wrong
                raise AssertionError(f"the model accepts {name}={value!r}")
            try:
                self.TARGET.make(bad)
            except Exception as exc:
                assert re.search(rf"\b{name}\b", str(exc)), (
                    f"{name}={value!r} refused with an error that does not name {name}: {exc}"
                )
            else:
                raise AssertionError(f"the target accepts {name}={value!r}")

    @property
    def oracle(self) -> LockstepManager:
        return self.oracles[self.active]

    @property
    def model(self) -> Model:
        return self.oracles[self.active].model

    def _begin(self):
        self.clean = False
        self.steps += 1
        for oracle in self.oracles:
            oracle.set_step(self.steps)

    def teardown(self):
        if self.oracles:
            try:
                if self.clean:
                    self._final_reads()
            finally:
                self._teardown()

    def _final_reads(self):
        """What a consumer reads at the end of an example: the metrics not read yet and the
        events not drained yet (spec §5.1, §5.3), so that a miscounted skip or a missing
        event is seen whether or not a drawn step read them (swarm testing switches
        ``read_stats`` and ``take_events`` off in some examples). Only after a clean last step:
        a failure already found is the one reported."""
        self.steps += 1
        for oracle in self.oracles:
            oracle.set_step(self.steps)
            oracle.get_stats()
            if oracle is not self.oracle:
                oracle.take_events()
        self._drain(final=True)  # the active manager's, recorded as a drain (labels count)
        self._check_retained()

    def _held(self) -> list:
        """The request contexts the scheduler still holds: live requests, and finished ones
        with a job in flight (spec §1)."""
        held = {id(req): req for req in self.live}
        for req in self._bundled_requests():
            if req.ctx is not None:
                held[id(req)] = req
        for job in self.in_flight:
            if job.req.ctx is not None:
                held[id(job.req)] = job.req
        return [req.ctx for req in held.values()]

    def _bundled_requests(self) -> list[Req]:
        """The requests the bundles still hold, directly or through a job (Hypothesis keeps a
        reference by name in each bundle, the value in ``names_to_values``)."""
        found = []
        for bundle in self.bundles.values():
            for ref in bundle:
                item = self.names_to_values.get(getattr(ref, "name", ""), ref)
                req = getattr(item, "req", item)
                if isinstance(req, Req):
                    found.append(req)
        return found

    def _long_run(self, kind: str, keys: list) -> int:
        """How many times a step of ``kind`` repeats its calls of ``keys`` (spec §4.8): at the
        example's first such step, as many per key as the retained-state bound allows entries
        now, so that whatever a manager keeps per call and key outgrows the bound within the
        step; at its later ones, none (a run's time goes to new states)."""
        if kind in self.long_runs or not keys:
            return 0
        self.long_runs.add(kind)
        bound, _ = self.oracle.retained_bound(self._held())
        return bound // len(keys) + 1

    def _check_retained(self) -> None:
        """Each manager's retained state within its bound (spec §4.8); where it cannot be
        measured, the history says why (never a verdict)."""
        held = self._held()
        for inst, oracle in enumerate(self.oracles):
            if oracle.check_retained(held) is None and oracle.unmeasured:
                self.record("retained state not measured", instance=inst, why=oracle.unmeasured)

    def _teardown(self):
        if self.oracles:
            self.count_labels()
            if currently_in_test_context():
                hypothesis_target(float(self.max_victims), label="victims per offer")
                hypothesis_target(float(self.max_pinned), label="pinned chunks")
                hypothesis_target(float(self.pushouts), label="tracker push-outs")
                # one score for the rarest decisions and the states just before them (a
                # separate label each would split the search's effort among more targets)
                near = min(self.lost, 2) + min(self.stale, 2)
                hypothesis_target(
                    float(4 * self.rare + near),
                    label="filtered removals, skips of admitted keys, and their eves",
                )
            self._release_contexts()

    def _release_contexts(self) -> None:
        """Free every context of the example now. A machine is kept in reference cycles (its
        rule strategy holds it), so without this its last contexts would be freed whenever the
        garbage collector next runs, in the middle of a later example, and that example's
        replay would then reuse a dead context's memory differently (a flaky failure)."""
        for req in self.live:
            req.ctx = None
        for req in self._bundled_requests():
            req.ctx = None
        self.live.clear()
        self.in_flight.clear()
        self._dropped.clear()

    # --- requests and positions ---

    def _new_request(
        self, req_id: str, layout: str, replacing: Req | None = None
    ) -> tuple[Req, bool]:
        """A new request; ``replacing``: a finished one whose context is dropped (if no job of
        it is in flight) right before the new context is made, so that the new context takes
        its memory, the same way in every replay of the example."""
        if replacing is not None:
            self._drop_if_done(replacing)
        ctx = self.contexts.new(req_id, release=self._dropped)  # the dead ones go right before
        reused = id(ctx) in self.dead_ids
        req = Req(self.n_requests, req_id, ctx, layout)
        self.n_requests += 1
        self.live.append(req)
        for name, slot in FIXED.get(layout, {}).items():
            self.oracle.set_position(ctx, KEYS[name], slot * TOKENS_PER_KEY)
        self.handles.name(ctx, repr(req))
        for oracle in self.oracles:
            oracle.on_new_request(ctx)
        return req, reused

    def _place(self, req: Req, keys: list[bytes]) -> None:
        """ "prefix" layout: each key the request shows for the first time ends next."""
        if req.layout != "prefix":
            return
        for key in keys:
            if self.oracle.position(req.ctx, key) is None:
                req.placed += 1
                self.oracle.set_position(req.ctx, key, req.placed * TOKENS_PER_KEY)

    # --- offers ---

    @rule(target=stores, req=requests, key_names=offer_keys)
    def offer(self, req, key_names):
        self._begin()
        keys = [KEYS[n] for n in key_names]
        repeated = len(set(keys)) < len(keys)
        if (
            not self.exact_interface
        ):  # upstream managers do not deduplicate; schedulers never repeat
            keys = list(dict.fromkeys(keys))
        return self._offer("offer", req, keys, repeated=repeated and self.exact_interface)

    @rule(target=stores, req=requests)
    def retry(self, req):
        """The scheduler's next step offers the same keys again through the same context."""
        self._begin()
        if req.last_offer is None:
            return multiple()
        return self._offer("retry", req, req.last_offer, after_none=req.last_failed)

    def _lost(self) -> list:
        """Live requests whose admitted keys (this manager, this generation) have since left
        the cache and the tracker, with those keys: spec A5's named case, where the request's
        next offer of such a key skips it and that skip counts."""
        model = self.model
        if model.threshold < 2:
            return []
        now = (self.active, self.generations[self.active])
        tracked = {k for k, _ in model.tracker}
        found = []
        for req in self.live:
            admitted = req.admitted.get(now, ())
            keys = [
                k
                for k in req.offered
                if k in admitted and k not in model.resident and k not in tracked
            ]
            if keys:
                found.append((req, keys))
        return found

    @precondition(lambda self: self._lost())
    @rule(target=stores, pick=st.integers(0, 2))
    def reoffer_lost(self, pick):
        """A request offers again the keys it had admitted and has lost since (a failed store,
        an eviction) once the tracker let them go: spec A5's case of a later offer's skip."""
        self._begin()
        lost = self._lost()
        req, keys = lost[pick % len(lost)]
        return self._offer("reoffer_lost", req, keys)

    def _near(self) -> None:
        """Record how close this step came to the two rarest defects (``teardown`` targets
        them): admitted keys lost and still wanted, and live requests whose record is of an
        older generation while keys it saw are resident again (spec R3: it commits nothing)."""
        self.lost = max(self.lost, sum(len(keys) for _, keys in self._lost()))
        model = self.model
        if not model.request or len(model.resident) < 2:
            return
        stale = 0
        for req in self.live:
            rec = model.slots.get(self.oracle.handle(req.ctx))
            if (
                rec is not None
                and rec.owner is model
                and rec.generation < model.generation
                and not rec.committed
                and any(k in model.resident for k in rec.seen)
            ):
                stale += 1
        self.stale = max(self.stale, stale)

    @rule(target=stores, req=requests)
    def preempt_and_resume(self, req):
        """A resumed request re-offers its keys from the first chunk, same context."""
        self._begin()
        if not req.offered:
            return multiple()
        return self._offer("preempt_and_resume", req, list(req.offered))

    def _offer(self, rule_name, req, keys, **facts):
        inst, oracle, model = self.active, self.oracle, self.model
        gen = self.generations[inst]
        first = req.since.setdefault(inst, gen)
        facts["across_reset"] = first < gen
        facts["shared"] = len(req.since) > 1
        if facts["across_reset"]:
            req.since[inst] = gen
        self._place(req, keys)
        rec = model.slots.get(oracle.handle(req.ctx))
        mine = rec is not None and rec.owner is model and rec.generation == model.generation
        skipped_before = rec.skipped if mine else frozenset()
        tracked_before = {k for k, _ in model.tracker}
        full = model.threshold >= 2 and len(tracked_before) >= model.max_tracker_size
        ranks = dict(model.rank)
        t2_pinned = model.policy == "arc" and self._t2_pinned_t1_busy(model, keys)
        got = oracle.prepare_store(keys, req.ctx)
        for key in dict.fromkeys(keys):
            if key not in req.offered:
                req.offered.append(key)
        req.last_offer, req.last_failed = keys, got is None
        rec = model.slots[oracle.handle(req.ctx)]  # prepare_store made it this manager's
        admitted = req.admitted.setdefault((inst, gen), set())
        newly_skipped = rec.skipped - skipped_before
        tracked = {k for k, _ in model.tracker}
        pushed = tracked_before - tracked
        victims = 0 if got is None else len(got[2])
        needed = got is None or victims > 0
        self.max_victims = max(self.max_victims, victims)
        self.pushouts += len(pushed)
        self.rare += bool(newly_skipped & admitted)
        self.record(
            rule_name,
            req=repr(req),
            keys=[name_of(k) for k in keys],
            none=got is None,
            victims=victims,
            pushed_out=bool(pushed),
            refused_by_tracker=full and any(k not in tracked for k in keys),
            skip_after_admit=bool(newly_skipped & admitted),
            lifted=any(
                k in ranks and ranks[k] < model.rank.get(k, ranks[k])
                for k in keys
                if got is None or k not in got[0]
            ),
            t2_pinned=t2_pinned and needed,
            **facts,
        )
        self._near()
        if got is None or not got[0]:
            return multiple()
        admitted.update(got[0])
        req.in_flight += 1
        job = Job(list(got[0]), req, inst, gen)
        self.in_flight.append(job)
        return job

    @staticmethod
    def _t2_pinned_t1_busy(model, keys) -> bool:
        """ARC: T2 holds a pinned key while T1 has no idle key this offer could evict."""
        r = model.resident
        return any(r[k]["ref"] > 0 for k in model.t2) and not any(
            r[k]["ref"] == 0 and k not in keys for k in model.t1
        )

    @rule(target=requests, req=consumes(requests), layout=layouts)
    def finish(self, req, layout):
        """The request ends (its recency is committed: spec R3) and the next one starts at
        once, with the same ``req_id`` (a new context is a new request, spec A3) and its own
        position layout; its context is made right after the finished one's is dropped (when
        no job of it is in flight), so it often takes the same memory."""
        self._begin()
        model = self.model
        rec = model.slots.get(self.oracle.handle(req.ctx))
        before = model.policy_state()
        t1_before = set(model.t1)
        req.finished = True
        self.live.remove(req)
        for oracle in self.oracles:
            oracle.on_request_finished(req.ctx)
        after = model.policy_state()
        seen = list(rec.seen) if rec is not None and rec.owner is model else []
        facts = dict(
            moved=before != after,
            layout=req.layout,
            groups=len({GROUP_OF[name_of(k)] for k in seen if k in model.resident}),
            unplaced=any(self.oracle.position(req.ctx, k) is None for k in seen),
            promoted=bool(t1_before & set(model.t2)),
        )
        nxt, reused = self._new_request(req.req_id, layout, replacing=req)
        dropped = req.ctx is None
        self.record(
            "finish", req=repr(req), next=repr(nxt), dropped=dropped, id_reused=reused, **facts
        )
        return nxt

    def _drop_if_done(self, req: Req) -> bool:
        """Drop a finished request's context once no job of it is in flight. It is freed when
        the next request starts, right before its context is made (reference counting frees
        it there, the same way in every replay)."""
        if req.finished and req.in_flight == 0 and req.ctx is not None:
            self.dead_ids.add(id(req.ctx))
            self._dropped.append(req.ctx)
            req.ctx = None
            return True
        return False

    @precondition(lambda self: self.active + 1 < len(self.oracles))
    @rule()
    def switch_manager(self):
        """Every later step goes to a new manager instance; the live contexts go with it."""
        self._begin()
        self.active += 1
        self.record("switch_manager", active=self.active)

    # --- store completions, loads, touches, lookups ---

    def _stale(self, job) -> bool:
        return job.done or job.generation != self.generations[job.inst]

    @rule(job=consumes(stores))
    def complete_store(self, job):
        self._store_done(job, True)

    @rule(job=consumes(stores))
    def fail_store(self, job):
        """The store's copy failed: ``complete_store(success=False)``."""
        self._store_done(job, False)

    def _store_done(self, job, success):
        self._begin()
        if job.done:
            return
        if self._stale(job):
            # The copy finishes after the reset. Delivered when none of its keys is pending
            # again (a later store's): the manager must ignore it, keys absent or ready alike.
            oracle = self.oracles[job.inst]
            late = not any(oracle.model.resident.get(k, {}).get("ref") == -1 for k in job.keys)
            if late:
                job.done = True
                oracle.complete_store(job.keys, job.req.ctx, success=success)
            self.record("complete_store", success=success, stale=True, delivered=late)
            return
        self._complete(job, success)

    @precondition(lambda self: self.in_flight)
    @rule()
    def flush_stores(self):
        """Every store in flight completes, as when the scheduler waits for its jobs."""
        self._begin()
        for job in list(self.in_flight):
            self._complete(job, True)

    def _complete(self, job, success):
        job.done = True
        self.in_flight.remove(job)
        self.oracles[job.inst].complete_store(job.keys, job.req.ctx, success=success)
        job.req.in_flight -= 1
        dropped = self._drop_if_done(job.req)
        self.record("complete_store", success=success, dropped=dropped)

    def _ready(self) -> bool:
        return any(r["ref"] >= 0 for r in self.model.resident.values())

    @precondition(lambda self: self._ready())
    @rule(target=loads, req=requests, key_names=some_keys, touch_first=st.booleans())
    def load(self, req, key_names, touch_first):
        """``req`` loads the keys that hit, after a ``touch`` of them when drawn (and the
        target has touch). Before its load, at the example's first, a long run's worth in one
        step (spec §4.8): the same touch, load and unload, ``_long_run`` times; then the
        retained state is checked.
        The repeats change nothing the model sees (the request's record already holds the
        keys after the first; a touch of the same resident keys leaves the same order), so
        the machine's draws and every other check are as without them."""
        self._begin()
        keys = [KEYS[n] for n in key_names if self.model.lookup(KEYS[n]) == "HIT"]
        if not keys:
            return multiple()
        self._place(req, keys)
        touched = touch_first and self.can_touch
        if touched:
            self.oracle.touch(keys, req.ctx)
        for _ in range(self._long_run("load", keys)):  # a long run's loads of them, at once
            if touched:
                self.oracle.touch(keys, req.ctx)
            self.oracle.prepare_load(keys, req.ctx)
            self.oracle.complete_load(keys, req.ctx)
        self._check_retained()
        self.oracle.prepare_load(keys, req.ctx)
        pinned = sum(1 for r in self.model.resident.values() if r["ref"] > 0)
        self.max_pinned = max(self.max_pinned, pinned)
        self.record("load", keys=[name_of(k) for k in keys], touched=touched)
        req.in_flight += 1
        return Job(keys, req, self.active, self.generations[self.active])

    @rule(job=consumes(loads))
    def complete_load(self, job):
        self._begin()
        job.req.in_flight -= 1
        if self._stale(job):
            self.record("complete_load", stale=not job.done)
        else:
            job.done = True
            self.oracles[job.inst].complete_load(job.keys, job.req.ctx)
            self.record("complete_load")
        self._drop_if_done(job.req)

    @precondition(lambda self: self.can_touch and self.model.resident)
    @rule(req=requests, key_names=distinct_keys)
    def touch(self, req, key_names):
        """A touch, then (at the example's first) a long run's touches of the resident ones
        in one step."""
        self._begin()
        keys = [KEYS[n] for n in key_names]
        self.oracle.touch(keys, req.ctx)
        resident = [k for k in keys if k in self.model.resident]  # a ghost would adapt again
        for _ in range(self._long_run("touch", resident)):
            self.oracle.touch(resident, req.ctx)
        self._check_retained()
        self.record("touch", keys=key_names)

    @rule(req=requests, key_name=st.sampled_from(KEY_NAMES), resident=st.booleans())
    def lookup(self, req, key_name, resident):
        """A lookup at any point (``resident``: of a resident key, when there is one), and for a
        hit where it comes from (``get_load_source``)."""
        self._begin()
        key = KEYS[key_name]
        if resident and self.model.resident:
            keys = sorted(self.model.resident)
            key = keys[KEY_NAMES.index(key_name) % len(keys)]
        hit = self.oracle.lookup(key, req.ctx) == "HIT"
        if hit:
            self.oracle.get_load_source(key, req.ctx)
        self.record("lookup", hit=hit)

    @precondition(lambda self: self.can_reset and self.model.resident)
    @rule()
    def reset(self):
        self._begin()
        inst, model = self.active, self.model
        if model.skips or model.samples:
            self.unreported_reset[inst] = True
        self.oracle.reset_cache()
        self.generations[inst] += 1
        for job in [j for j in self.in_flight if j.inst == inst]:  # stale from now on
            self.in_flight.remove(job)
            job.req.in_flight -= 1
            self._drop_if_done(job.req)
        self.record("reset_cache")

    @rule()
    def read_stats(self):
        """``get_stats()`` at a drawn point (what happened since the last read), with the
        answers that depend on nothing else: ``config_info`` and ``has_pending_work``."""
        self._begin()
        self.oracle.get_stats()
        self.oracle.config_info()
        self.oracle.has_pending_work()
        if self.empty is not None:
            self.empty.set_step(self.steps)
            self.empty.get_stats()
        self.record("read_stats", unreported=self.unreported_reset[self.active])
        self.unreported_reset[self.active] = False

    @rule()
    def take_events(self):
        """Drain the events at a drawn point; they must replay to the ready keys."""
        self._begin()
        self._drain()

    def _drain(self, final: bool = False):
        """Drain and record it; ``final`` (teardown's read) leaves the search's score alone:
        what the end of an example shows must not steer the examples before it."""
        model = self.model
        filtered = any(
            meta and any(k in model.resident for k in keys) for keys, _, meta, _, _ in model.events
        )
        self.oracle.take_events()
        if not final:
            self.rare += filtered
        self.record("take_events", filtered=filtered)

    # --- bad input: a clear error and no change ---

    @precondition(lambda self: self.exact_interface and self.model.resident)
    @rule(call=bad_calls)
    def bad_input(self, call):
        """A protocol error: the target must refuse it, name the key, and change nothing.
        ``call``: (kind, good keys, the bad key)."""
        self._begin()
        kind, good, bad = call
        oracle, model, key = self.oracle, self.model, KEYS[bad]
        req = self.live[0]
        target = oracle.target
        refused = True
        if kind == "prepare_load" and model.lookup(key) != "HIT":
            keys = [KEYS[n] for n in good if model.lookup(KEYS[n]) == "HIT"] + [key]
            oracle.refuse("prepare_load", (keys,), lambda: target.prepare_load(keys, req.ctx), key)
            if "get_load_source" not in self.TARGET.missing:  # asked of a key that is no hit
                oracle.refuse(
                    "get_load_source", (key,), lambda: target.get_load_source(key, req.ctx), key
                )
            if model.request:
                self._misuse_after_finish(keys[:-1])
        elif kind == "complete_load" and model.resident.get(key, {"ref": 0})["ref"] <= 0:
            oracle.refuse(
                "complete_load", ([key],), lambda: target.complete_load([key], req.ctx), key
            )
        elif kind == "key type":
            keys = [KEYS[n] for n in good] + ["not-bytes"]
            oracle.refuse(
                "prepare_store",
                (keys, req.ctx),
                lambda: target.prepare_store(keys, req.ctx),
                "not-bytes",
            )
        elif kind == "context":  # a store needs a request context: it must name what it got
            keys = [KEYS[n] for n in good]
            oracle.refuse(
                "prepare_store",
                (keys, "not-a-context"),
                lambda: target.prepare_store(keys, "not-a-context"),
                "not-a-context",
                call="prepare_store",
            )
            if model.request:
                self._misuse_under_request(keys)
        else:
            refused = False
        self.record("bad_input", kind=kind, refused=refused)

    def _misuse_under_request(self, keys: list[bytes]) -> None:
        """Request-scoped misuse (spec section 8): a load, which records its keys, given no
        request context; the finish of a request never opened (R3: no record, it does
        nothing); misuse through a finished request."""
        oracle, model, target = self.oracle, self.model, self.oracle.target
        ready = [k for k in keys if model.lookup(k) == "HIT"]
        oracle.refuse(
            "prepare_load",
            (ready, "not-a-context"),
            lambda: target.prepare_load(ready, "not-a-context"),
            "not-a-context",
            call="prepare_load",
        )
        stray = oracle.new_context("stray")  # R3: no record, no commit
        self.handles.name(stray, "stray")
        oracle.on_request_finished(stray)
        self._misuse_after_finish(keys)

    def _misuse_after_finish(self, keys: list[bytes]) -> None:
        """Through a request that has finished (its record of this manager and generation
        committed, spec R3): an offer of ``keys``, and a load of ready keys it never saw, must
        be refused naming its context (spec section 8)."""
        oracle, model, target = self.oracle, self.model, self.oracle.target
        done = [
            (req.ctx, rec)
            for req in self._finished_held()
            if (rec := model.slots.get(oracle.handle(req.ctx))) is not None
            and rec.owner is model
            and rec.generation == model.generation
            and rec.committed
        ]
        if not done:
            return
        ctx, rec = done[0]
        oracle.refuse("prepare_store", (keys, ctx), lambda: target.prepare_store(keys, ctx), ctx)
        unseen = [k for k in model.resident if model.lookup(k) == "HIT" and k not in rec.seen]
        if unseen:
            oracle.refuse("prepare_load", (unseen,), lambda: target.prepare_load(unseen, ctx), ctx)

    def _finished_held(self) -> list[Req]:
        """Finished requests whose context is still held (a store or load of theirs is in
        flight), in the order they were made."""
        reqs = {id(job.req): job.req for job in self.in_flight}.values()
        return sorted((r for r in reqs if r.finished and r.ctx is not None), key=lambda r: r.n)

    # --- the invariant: the oracle's check of what the step changed ---

    @invariant()
    def agrees_with_model(self):
        self.clean = False
        for oracle in self.oracles:
            oracle.check_state()
        self.clean = True  # the step and its checks passed (teardown's final reads)


def machine_name(kind: str, spec: str) -> str:
    """A class name that is a valid identifier, so the printed program runs as it stands."""
    return kind + "_" + "".join(c if c.isalnum() else "_" for c in spec)


def make_machine(target: Target, policies: tuple[str, ...] | None = None):
    """A machine class checking ``target`` under the given policies (default: the target's)."""
    chosen = tuple(policies or target.policies)
    recencies = target.recencies

    class Machine(ManagerMachine):
        TARGET = target
        POLICIES = chosen

        @initialize(
            target=ManagerMachine.requests,
            num_chunks=st.integers(1, 5),
            store_threshold=st.sampled_from([2, 1, 2, 1, 3, 0, 4]),
            max_tracker_size=st.sampled_from([1, 2, 3, 4, 5, 6, LARGE_TRACKER]),
            policy=st.sampled_from(chosen),
            recency=st.sampled_from(recencies),
            enable_events=st.sampled_from([True, True, False]),
            instances=st.integers(1, 2),
            layouts=st.lists(layouts, min_size=3, max_size=3),
            # drawn only where the target can name a policy by module path (a fixed value
            # draws nothing, so other targets see the same examples as without it)
            policy_by_path=st.booleans() if target.takes_policy_path else st.just(False),
        )
        def configure(
            self,
            num_chunks,
            store_threshold,
            max_tracker_size,
            policy,
            recency,
            enable_events,
            instances,
            layouts,
            policy_by_path,
        ):
            """Build targets and models; three requests run from the start (each one that
            finishes is followed by the next), so offers can begin at step one."""
            return self._configure(
                Config(
                    num_chunks=num_chunks,
                    store_threshold=store_threshold,
                    max_tracker_size=max_tracker_size,
                    cache_policy=policy,
                    enable_events=enable_events,
                    recency=recency,
                    policy_by_path=policy_by_path,
                ),
                instances,
                layouts,
            )

    Machine.__name__ = Machine.__qualname__ = machine_name("ManagerMachine", target.spec)
    return Machine
