"""Table 3: operations per second of impl's manager on a fixed trace, and of vLLM's where it
can be imported.

How it works and why: docs/internals.md, section bench/manager_speed.py.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import gc
import itertools
import json
import platform
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.impl.base import GROUP_BYTES, ReqContext, make_key
from kvgate.impl.manager import OffloadingManager

GOAL_RATIO = 1.0

# Trace opcodes.
NEW, FINISH, LOOKUP, LOAD, DONE_LOAD, OFFER, DONE_STORE, TOUCH, EVENTS, STATS = range(10)
OP_NAMES = (
    "on_new_request",
    "on_request_finished",
    "lookup",
    "prepare_load",
    "complete_load",
    "prepare_store",
    "complete_store",
    "touch",
    "take_events",
    "get_stats",
)


@dataclass(frozen=True)
class TraceSpec:
    ops: int = 100_000
    num_chunks: int = 10_000
    store_threshold: int = 2
    max_tracker_size: int = 64_000
    # Enough distinct keys that the tracker fills (about two thirds in) and the cache
    # evicts, and enough repeats that keys pass the threshold and loads hit.
    documents: int = 100_000  # distinct documents; a document is a chain of keys
    max_length: int = 32  # keys per document: 2 to max_length
    max_offer: int = 8  # keys per offer: 1 to max_offer
    zipf: float = 0.9  # popularity of the document of rank r ~ 1 / (r + 1) ** zipf
    max_active: int = 16  # requests in flight at once
    seed: int = 0

    def describe(self) -> str:
        return (
            f"{self.ops:,} operations, {self.num_chunks:,} chunks, store_threshold "
            f"{self.store_threshold}, tracker of {self.max_tracker_size:,} keys, "
            f"{self.documents:,} Zipf({self.zipf:g}) documents, seed {self.seed}"
        )


@dataclass
class Trace:
    spec: TraceSpec
    policy: str
    entries: list[tuple]  # (opcode, request slot or None, key indexes, or a flag, or None)
    keys: list[bytes]  # key index -> kvgate key
    contexts: int  # number of request contexts the trace creates
    effects: dict  # what the trace did to impl's manager as it was written


def _is_hit(result) -> bool:
    return result is True or getattr(result, "name", None) == "HIT"


class Player:
    """Plays trace entries into one manager; ``play(entry)`` makes one call, or none when an
    entry that depends on the answers finds nothing to do (no store in flight, no hit)."""

    def __init__(self, manager, keys: list, contexts: list):
        self.manager, self.keys, self.contexts = manager, keys, contexts
        self.stores: deque = deque()  # (keys, context) of stores in flight, oldest first
        self.loads: deque = deque()  # (keys, context) of loads in flight, oldest first
        self.hits: list = []  # what the lookups since the last load found HIT
        self.calls = [0] * len(OP_NAMES)
        # vLLM 0.34.0 has no touch: its touch entries make no call.
        self.has_touch = callable(getattr(manager, "touch", None))

    def play(self, entry) -> bool:
        op, slot, arg = entry
        m = self.manager
        if op == OFFER:
            ctx = self.contexts[slot]
            keys = self.keys
            out = m.prepare_store([keys[k] for k in arg], ctx)
            if out is not None and out.keys_to_store:
                self.stores.append((out.keys_to_store, ctx))
        elif op == DONE_STORE:
            if not self.stores:
                return False
            stored, ctx = self.stores.popleft()
            m.complete_store(stored, ctx, success=arg)
        elif op == LOOKUP:
            key = self.keys[arg]
            if _is_hit(m.lookup(key, self.contexts[slot])):
                self.hits.append(key)
        elif op == LOAD:
            if not self.hits:
                return False
            ctx = self.contexts[slot]
            m.prepare_load(self.hits, ctx)
            self.loads.append((self.hits, ctx))
            self.hits = []
        elif op == DONE_LOAD:
            if not self.loads:
                return False
            loaded, ctx = self.loads.popleft()
            m.complete_load(loaded, ctx)
        elif op == TOUCH:
            if not self.has_touch:
                return False
            keys = self.keys
            m.touch([keys[k] for k in arg], self.contexts[slot])
        elif op == NEW:
            self.hits = []
            m.on_new_request(self.contexts[slot])
        elif op == FINISH:
            m.on_request_finished(self.contexts[slot])
        elif op == EVENTS:
            for _ in m.take_events() or ():
                pass
        elif op == STATS:
            m.get_stats()
        self.calls[op] += 1
        return True


def generate(spec: TraceSpec = TraceSpec(), policy: str = "lru") -> Trace:
    """The trace: ``spec.ops`` entries. It is written while impl's manager (``policy``) plays
    it, so that an entry that depends on the answers is written only when it makes a call:
    every entry is one call for impl, and for any manager that answers the same."""
    rng = random.Random(spec.seed)
    lengths = [rng.randint(2, spec.max_length) for _ in range(spec.documents)]
    weights = list(itertools.accumulate(1.0 / (r + 1) ** spec.zipf for r in range(spec.documents)))
    order = list(range(spec.documents))
    rng.shuffle(order)  # popularity rank -> document
    first_key = list(itertools.accumulate(lengths, initial=0))
    keys = [
        make_key(d.to_bytes(4, "big") + i.to_bytes(2, "big"))
        for d in range(spec.documents)
        for i in range(lengths[d])
    ]
    contexts: list[ReqContext] = []
    effects = dict(stored=0, evicted=0, refused=0, tracker_full_at=None)

    class Counting(OffloadingManager):
        def prepare_store(self, keys, ctx):
            out = super().prepare_store(keys, ctx)
            if out is None:
                effects["refused"] += 1
            else:
                effects["stored"] += len(out.keys_to_store)
                effects["evicted"] += len(out.evicted_keys)
            return out

    manager = Counting(
        spec.num_chunks,
        cache_policy=policy,
        store_threshold=spec.store_threshold,
        max_tracker_size=spec.max_tracker_size,
    )
    sim = Player(manager, keys, contexts)

    def pick_document() -> int:
        return order[bisect.bisect_left(weights, rng.random() * weights[-1])]

    entries: list[tuple] = []
    active: dict[int, list] = {}  # slot -> [document keys, progress, last offer]

    def emit(*entry) -> None:
        if sim.play(entry):
            entries.append(entry)
            if (
                effects["tracker_full_at"] is None
                and manager.tracker is not None
                and len(manager.tracker.counts) >= manager.tracker.max_size
            ):
                effects["tracker_full_at"] = len(entries)

    while len(entries) < spec.ops:
        n = len(entries)
        if n % 1024 == 1023:
            emit(STATS, None, None)
        elif n % 64 == 63:
            emit(EVENTS, None, None)
        elif len(active) < spec.max_active and rng.random() < 0.15:
            doc = pick_document()
            doc_keys = list(range(first_key[doc], first_key[doc + 1]))
            slot = len(contexts)
            contexts.append(ReqContext(f"r{slot}"))
            active[slot] = [doc_keys, 0, None]
            emit(NEW, slot, None)
            for k in doc_keys[: rng.randint(1, 4)]:
                if len(entries) < spec.ops - 1:
                    emit(LOOKUP, slot, k)
            emit(LOAD, slot, None)
        elif sim.loads and rng.random() < 0.3:
            emit(DONE_LOAD, None, None)
        elif sim.stores and rng.random() < (0.6 if len(sim.stores) > 4 else 0.25):
            emit(DONE_STORE, None, rng.random() >= 0.05)
        elif active:
            slot = rng.choice(list(active))
            req = active[slot]
            doc_keys, progress, last = req
            roll = rng.random()
            if roll < 0.12 and last is not None:  # the next step retries the same offer
                emit(OFFER, slot, last)
            elif roll < 0.17 and progress:  # preempted and resumed: re-offer from the start
                emit(OFFER, slot, doc_keys[:progress])
            elif roll < 0.22 and progress:  # the prefix is hit again
                emit(TOUCH, slot, doc_keys[: min(progress, 4)])
            elif progress < len(doc_keys):
                offer = doc_keys[progress : progress + rng.randint(1, spec.max_offer)]
                req[1], req[2] = progress + len(offer), offer
                emit(OFFER, slot, offer)
            else:
                emit(FINISH, slot, None)
                del active[slot]
    effects["free_chunks_at_end"] = manager.free_chunks
    return Trace(spec, policy, entries, keys, len(contexts), effects)


def replay(trace: Trace, manager, keys: list, contexts: list) -> tuple[int, float, dict]:
    """Play ``trace`` into ``manager``: (calls made, seconds, calls per operation)."""
    player = Player(manager, keys, contexts)
    play = player.play
    entries = trace.entries
    gc.collect()
    start = time.perf_counter()
    for entry in entries:
        play(entry)
    seconds = time.perf_counter() - start
    return sum(player.calls), seconds, dict(zip(OP_NAMES, player.calls))


@dataclass
class Contender:
    name: str
    build: Callable[[str], object]  # policy -> a fresh manager
    keys: list  # trace key index -> this manager's key
    new_context: Callable[[str], object]  # req_id -> a fresh request context


def impl_contender(trace: Trace) -> Contender:
    spec = trace.spec

    def build(policy):
        return OffloadingManager(
            spec.num_chunks,
            cache_policy=policy,
            store_threshold=spec.store_threshold,
            max_tracker_size=spec.max_tracker_size,
        )

    return Contender("impl", build, trace.keys, ReqContext)


def vllm_contender(trace: Trace, spec_text: str = "vllm") -> tuple[Contender | None, str]:
    """vLLM's manager (or ``vllm=MODULE:ATTR``) with its own keys and contexts, or None and
    why not."""
    from kvgate.properties.adapters import TargetError
    from kvgate.properties.engines.vllm.adapter import resolve_vllm

    try:
        target = resolve_vllm(spec_text)
        # The adapter knows vLLM's key and context types; take both from it.
        adapter = target.adapter(target.factory(1, cache_policy="lru"))
    except TargetError as exc:
        return None, str(exc)
    spec = trace.spec
    make = adapter.types.make_offload_key
    keys = [make(k[:-GROUP_BYTES], int.from_bytes(k[-GROUP_BYTES:], "big")) for k in trace.keys]

    def build(policy):
        return target.factory(
            spec.num_chunks,
            cache_policy=policy,
            store_threshold=spec.store_threshold,
            max_tracker_size=spec.max_tracker_size,
        )

    name = "vLLM CPUOffloadingManager" if spec_text == "vllm" else spec_text
    return Contender(name, build, keys, adapter.new_context), ""


@dataclass
class Row:
    manager: str
    policy: str
    calls: int
    seconds: float  # best replay
    per_op: dict
    error: str = ""
    effects: dict | None = None  # the trace's effects on impl (see ``generate``)
    env: str = ""  # the release environment that ran this row ("": this process)
    has_touch: bool = True

    @property
    def ops_per_s(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0


def run_once(contender: Contender, trace: Trace) -> Row:
    manager = contender.build(trace.policy)
    contexts = [contender.new_context(f"r{i}") for i in range(trace.contexts)]
    calls, seconds, per_op = replay(trace, manager, contender.keys, contexts)
    return Row(
        contender.name,
        trace.policy,
        calls,
        seconds,
        per_op,
        effects=trace.effects,
        has_touch=callable(getattr(manager, "touch", None)),
    )


LEVELS = {
    "full": (TraceSpec(), 3),
    "quick": (TraceSpec(ops=20_000), 1),
    "smoke": (TraceSpec(ops=2_000, documents=2_000), 1),
}  # (trace, replays)


def measure(level: str = "full", vllm: str = "vllm", policies=("lru", "arc"), progress=None):
    """(spec, rows, why vLLM is missing): each policy's trace replayed ``repeats`` times into
    impl and into vLLM, the two interleaved; each keeps its best replay. With ``vllm="vllm"``
    and release environments built, one child per release measures both in that release's
    python (``measure_releases``); otherwise both are measured here (``measure_here``)."""
    if vllm == "vllm":
        from bench.release_envs import release_pythons

        found, missing = release_pythons()
        if found:
            return measure_releases(level, found, missing, policies, progress)
    return measure_here(level, vllm, policies, progress)


def measure_releases(level, found, missing, policies=("lru", "arc"), progress=None):
    """Each release's rows, measured by a child in its environment (see ``child``)."""
    from bench.release_envs import run_child

    spec = LEVELS[level][0]
    rows, why = [], []
    if level == "smoke":  # a test that the table is built: the first release CI gates alone
        found, missing = found[:1], []
    for version, python in found:
        if progress:
            progress(f"vLLM {version}: measuring in {python}")
        try:
            answer = run_child(
                python,
                "bench.manager_speed",
                ["--child", level, "--policies", ",".join(policies)],
                progress=progress,
            )
        except RuntimeError as exc:
            why.append(f"vLLM {version}: {exc}")
            continue
        if answer.get("why"):
            why.append(f"vLLM {version}: {answer['why']}")
        for fields in answer["rows"]:
            row = Row(**fields)
            row.env = f"vLLM {version} env (python {answer['python']})"
            if row.manager != "impl":
                row.manager = f"vLLM {version}"
            rows.append(row)
    why += [f"vLLM {v}: no environment at {python_dir(v)}" for v in missing]
    return spec, rows, "; ".join(why)


def python_dir(version: str) -> str:
    from bench.release_envs import envs_dir

    return str(envs_dir() / version)


def child(level: str, policies: list[str]) -> int:
    """In a release's environment: measure impl and that release's manager here, print the rows
    and which kvgate.impl was imported as one JSON line."""
    import kvgate.impl.manager as impl_manager

    def progress(line):
        print(line, file=sys.stderr, flush=True)

    _, rows, why = measure_here(level, "vllm", policies, progress)
    print(
        json.dumps(
            {
                "rows": [dataclasses.asdict(r) for r in rows],
                "why": why,
                "impl_file": impl_manager.__file__,
                "python": platform.python_version(),
            }
        )
    )
    return 0


def measure_here(level: str = "full", vllm: str = "vllm", policies=("lru", "arc"), progress=None):
    """``measure`` in this process: vLLM imported here, or ``vllm=MODULE:ATTR``."""
    spec, repeats = LEVELS[level]
    rows, why = [], ""
    for policy in policies:
        trace = generate(spec, policy)
        contenders = [impl_contender(trace)]
        other, why = vllm_contender(trace, vllm)
        if other is not None:
            contenders.append(other)
        best: dict[str, Row] = {}
        for _ in range(repeats):
            for c in contenders:
                try:
                    row = run_once(c, trace)
                except Exception as exc:  # a manager without this policy, say
                    best[c.name] = Row(c.name, policy, 0, 0.0, {}, f"{type(exc).__name__}: {exc}")
                    break
                if c.name not in best or row.seconds < best[c.name].seconds:
                    best[c.name] = row
        for row in best.values():
            rows.append(row)
            if progress:
                progress(
                    f"{row.manager} {policy}: {row.ops_per_s:,.0f} ops/s"
                    + (f" ({row.error})" if row.error else "")
                )
    return spec, rows, why


def _impl_of(rows: list[Row], r: Row) -> Row | None:
    """The impl row measured beside ``r``: same policy, same process."""
    return next(
        (x for x in rows if x.policy == r.policy and x.env == r.env and x.manager == "impl"), None
    )


def table(spec: TraceSpec, rows: list[Row], why: str) -> str:
    envs = any(r.env for r in rows)
    out = [
        f"Trace: {spec.describe()}; one trace per policy, written while impl plays it; "
        "best of the replays."
        + (
            " Each release's rows come from one process in that release's environment "
            "(vLLM and impl interleaved there); impl / this compares the two."
            if envs
            else ""
        ),
        "",
        "| manager | policy | run in | calls | touch calls | seconds | ops/s | impl / this |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        impl = _impl_of(rows, r)
        where = r.env or "this process"
        if r.error:
            out.append(
                f"| {r.manager} | {r.policy} | {where} | - | - | - | - | failed: {r.error} |"
            )
            continue
        ratio = "-" if r is impl or impl is None else f"{impl.ops_per_s / r.ops_per_s:.2f}"
        touch = f"{r.per_op.get('touch', 0):,}" if r.has_touch else "none (no touch)"
        out.append(
            f"| {r.manager} | {r.policy} | {where} | {r.calls:,} | {touch} "
            f"| {r.seconds:.3f} | {r.ops_per_s:,.0f} | {ratio} |"
        )
    if any(not r.has_touch for r in rows):
        out += [
            "",
            "A manager without touch is not sent the trace's touch entries: its trace "
            "makes no touch calls, its recency is learnt from the other calls, and its "
            "ops/s divides the calls it was sent.",
        ]
    done = [r for r in rows if not r.error]
    if done:
        out += [
            "",
            "Calls made, per operation:",
            "",
            "| manager | policy | run in | " + " | ".join(OP_NAMES) + " |",
            "|---|---|---|" + "---:|" * len(OP_NAMES),
        ]
        for r in done:
            where = r.env or "this process"
            cells = " | ".join(
                f"{r.per_op.get(n, 0):,}" if n != "touch" or r.has_touch else "-" for n in OP_NAMES
            )
            out.append(f"| {r.manager} | {r.policy} | {where} | {cells} |")
    out.append("")
    seen = set()
    for r in rows:
        e = r.effects
        if r.manager == "impl" and e and r.policy not in seen:
            seen.add(r.policy)
            full = (
                f"full from operation {e['tracker_full_at']:,}"
                if e["tracker_full_at"]
                else "never full"
            )
            out.append(
                f"The {r.policy} trace on impl: {e['stored']:,} keys stored, "
                f"{e['evicted']:,} evicted, {e['refused']:,} offers refused (None); "
                f"tracker {full}; {e['free_chunks_at_end']:,} chunks free at the end."
            )
    if why:
        out += ["", f"vLLM not measured: {why}"]
    return "\n".join(out)


def goal(rows: list[Row]) -> tuple[bool | None, str]:
    ratios = []
    for r in rows:
        impl = _impl_of(rows, r)
        if r is not impl and impl is not None and not r.error:
            ratios.append(impl.ops_per_s / r.ops_per_s if r.ops_per_s else float("inf"))
    if not ratios:
        return None, (
            "manager speed: vLLM is not importable here, so the ratio (goal >= "
            f"{GOAL_RATIO:g}) is not measured"
        )
    met = min(ratios) >= GOAL_RATIO
    return met, (
        f"manager speed: impl / vLLM ops/s {min(ratios):.2f} at worst (goal >= "
        f"{GOAL_RATIO:g}): {'met' if met else 'NOT met'}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20,000 operations, one replay")
    ap.add_argument("--vllm", default="vllm", help="vllm, or vllm=MODULE:ATTR")
    ap.add_argument("--child", choices=sorted(LEVELS), help=argparse.SUPPRESS)
    ap.add_argument("--policies", default="lru,arc", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:  # inside a release's environment (see measure_releases)
        return child(args.child, args.policies.split(","))
    spec, rows, why = measure("quick" if args.quick else "full", args.vllm, progress=print)
    print(table(spec, rows, why))
    print(goal(rows)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
