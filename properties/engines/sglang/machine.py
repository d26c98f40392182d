"""The machine over SGLang's hierarchical cache: request lives as SGLang's scheduler makes them,
checked in lockstep against ``model/radix.py`` (spec §11).

Each example builds a fresh cache (its tree core drawn among the target's) and draws request
lives: prompts from two shared families cut at any length, with a tail from a two-token
alphabet (so requests diverge inside a node and split it), prefill in one or several chunks,
decode, finish, abort, retraction and resumption (with the prompt's nodes kept on the GPU, or
evicted first), eviction pressure, delayed copies, and resets when the scheduler is idle. After
every step: each page the cache copied to host in that step must have been inserted by at least
``threshold`` distinct requests, and each page on the GPU inserted by that many must be on host
(or on its way).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvgate.model.radix import RadixModel
from kvgate.properties.search.coverage import Recorded

from .life import divergence, page, pages, tokens
from .target import SGLangTarget

FAMILIES = (tuple(range(1, 13)), tuple(range(51, 63)))
TAIL = (200, 201)
OUTPUT = (300, 301)
MAX_LIVES = 4
MAX_OUTPUTS = 3


# What the machine's draws must reach (coverage labels over the request life's lines).
_LABELS = {
    "a page backed up to host": lambda e: e.get("copied", 0) > 0,
    "a chunk before the last": lambda e: (
        " chunk [" in e["step"] and ") (prefill" not in e["step"] and "finds no" not in e["step"]
    ),
    "a prefix shared on the GPU": lambda e: not e.get("resumed", True) and e["matched"] > 0,
    "a retraction": lambda e: e["step"].endswith(
        "retracted (computed KV released, waits to resume)"
    ),
    "resumed with its prefix on the GPU": lambda e: e.get("resumed") and e["matched"] > 0,
    "resumed after its prefix left the GPU": lambda e: e.get("resumed") and e["matched"] == 0,
    "a page evicted from the GPU": lambda e: e.get("evicted", 0) > 0,
    "an evicted page kept on host": lambda e: e.get("kept_on_host", 0) > 0,
    "an abort": lambda e: ": aborted, insert" in e["step"],
    "a delayed copy completed": lambda e: (
        e["step"].endswith("copies to host completed") and not e["step"].startswith("0 ")
    ),
    "a reset": lambda e: e["step"].startswith("reset (flush_cache)"),
    "built on the python tree core": lambda e: ", core python," in e["step"],
    "built on the rust tree core": lambda e: ", core rust," in e["step"],
}


def make_machine(target: SGLangTarget) -> type:
    """A ``RuleBasedStateMachine`` class over ``target`` that ``properties.runner.run_machine``
    runs (its failures carry the request life; ``last_history`` holds the steps' lines)."""

    class SGLangCacheMachine(Recorded, RuleBasedStateMachine):
        LABELS = {
            label: earns
            for label, earns in _LABELS.items()
            if not label.endswith(" tree core") or label.split()[-3] in target.cores
        }

        def __init__(self) -> None:
            super().__init__()
            self.history: list[dict] = []
            self.scheduler: Any = None  # scheduler.Scheduler, built by ``build``
            self.model = RadixModel(threshold=target.threshold)
            self.life: list[str] = []
            self.waiting: list[str] = []
            self.count = 0

        @initialize(
            core=st.sampled_from(target.cores),
            gpu=st.sampled_from((64, 20)),
            delay=st.booleans(),
        )
        def build(self, core, gpu, delay):
            self.scheduler = target.build(core, gpu_slots=gpu, host_slots=256, page_size=1)
            self.scheduler.recorder.delay = delay
            self._say(
                f"cache: {target.note or target.release}, core {core}, {gpu} GPU slots"
                + (", copies delayed" if delay else "")
            )

        # --- helpers ---
        def _names(self, admitted: bool | None = None, done: bool = False) -> list[str]:
            lives = self.scheduler.lives.values() if self.scheduler else ()
            return [
                life.name
                for life in lives
                if life.done == done and (admitted is None or life.admitted == admitted)
            ]

        def _prefilling(self) -> list[str]:
            return [
                n
                for n in self._names(admitted=True)
                if self.scheduler.lives[n].computed < len(self.scheduler.lives[n].tokens)
            ]

        def _decoding(self) -> list[str]:
            return [
                n
                for n in self._names(admitted=True)
                if self.scheduler.lives[n].computed == len(self.scheduler.lives[n].tokens)
            ]

        def _say(self, line: str, **facts) -> None:
            """One line of the request life, with the facts the coverage labels read."""
            self.life.append(line)
            self.record("step", step=line, **facts)
            type(self).last_history = [{"step": x} for x in self.life]

        def teardown(self) -> None:
            self.count_labels()
            type(self).last_history = [{"step": x} for x in self.life]

        def _evicted(self, gone) -> None:
            kept = sum(p in self.model.on_host for p in gone)
            self.model.evicted(gone)
            self._say(f"  evicted from GPU: {pages(gone)}", evicted=len(gone), kept_on_host=kept)

        def _settle(self, inserted: tuple[str, tuple[int, ...]] | None = None) -> None:
            """The step's effects in order: pages evicted, the insert, the copies; checked."""
            sched = self.scheduler
            gone = sched.gone_from_gpu()
            if gone:
                self._evicted(gone)
            if inserted is not None:
                name, toks = inserted
                self.model.insert(name, toks)
            sched.writing_check()
            copied = sched.recorder.take_new()
            if copied:
                self._say(f"  backup: {pages(copied)}", copied=len(copied))
                for p in copied:
                    if not self.model.due(p):
                        who = sorted(self.model.inserters.get(p, ()))
                        raise divergence(
                            f"page {page(p)} backed up to host after {len(who)} distinct "
                            f"request(s) inserted it ({', '.join(who) or 'none'}); the "
                            f"threshold is {self.model.threshold}",
                            self.life,
                        )
                self.model.backed_up(copied)
            gone = sched.gone_from_gpu()
            if gone:
                self._evicted(gone)

        # --- rules ---
        @precondition(lambda self: len(self._names()) + len(self._names(done=True)) < 12)
        @precondition(lambda self: len(self._names()) < MAX_LIVES)
        @rule(
            family=st.sampled_from((0, 1)),
            cut=st.integers(0, 12),
            tail=st.lists(st.sampled_from(TAIL), max_size=3),
            reset_first=st.booleans(),
        )
        def new_request(self, family, cut, tail, reset_first):
            if reset_first and self.scheduler.idle():
                self._reset()
            prompt = FAMILIES[family][:cut] + tuple(tail)
            if len(prompt) < 2:
                prompt = prompt + (TAIL[0],) * (2 - len(prompt))
            name = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[self.count % 26]
            self.count += 1
            self.scheduler.new(name, prompt, MAX_OUTPUTS)
            self._say(f"{name}: new request, prompt {tokens(prompt)}")

        def _advanceable(self) -> list[str]:
            """The lives that have a next step of their own: waiting to be admitted (again),
            prefilling, or decoding below their output limit; in the order they came."""
            lives = self.scheduler.lives.values() if self.scheduler else ()
            return [
                life.name
                for life in lives
                if not life.done
                and (
                    not life.admitted
                    or life.computed < len(life.tokens)
                    or len(life.outputs) < MAX_OUTPUTS
                )
            ]

        # One rule moves a request on to its next step (admission, a chunk of prefill, a
        # decode), so which rules apply does not hang on how many other requests are at which
        # step: Hypothesis picks a rule among those whose preconditions hold, and with one rule
        # per step a request could take, deleting another request's steps while shrinking
        # changed which rule every later draw names (a second request and two evictions that
        # play no part stayed in 0.5.23's counterexample).
        @precondition(lambda self: self._advanceable())
        @rule(
            pick=st.integers(0, MAX_LIVES - 1),
            rest=st.integers(0, 8),
            token=st.sampled_from(OUTPUT),
        )
        def advance(self, pick, rest, token):
            names = self._advanceable()
            life = self.scheduler.lives[names[pick % len(names)]]
            if not life.admitted:
                self._admit(life)
            elif life.computed < len(life.tokens):
                self._prefill(life, rest)
            else:
                self._decode(life, token)

        def _admit(self, life) -> None:
            if not self.scheduler.admit(life):
                return
            resumed = life.retractions > 0
            again = " (resumed)" if resumed else ""
            self._say(
                f"{life.name}: admitted{again}, prefix matched on GPU {life.computed}",
                resumed=resumed,
                matched=life.computed,
            )
            self._settle()

        def _prefill(self, life, rest: int) -> None:
            # the chunk leaves ``rest`` tokens to later chunks (at least one is computed): 0,
            # the whole prefill, is what it shrinks to, whatever length the prompt shrinks to
            start = life.computed
            end = max(start + 1, len(life.tokens) - rest)
            if not self.scheduler.prefill_chunk(life, end):
                self._say(f"{life.name}: chunk [{start}, {end}) finds no GPU slots")
                self._settle()
                return
            last = "" if end < len(life.tokens) else " (prefill done)"
            self._say(
                f"{life.name}: chunk [{start}, {end}){last}, insert {tokens(life.tokens[:end])}"
            )
            self._settle((life.name, life.tokens[:end]))

        def _decode(self, life, token: int) -> None:
            if self.scheduler.decode(life, token):
                self._say(f"{life.name}: decode {token}")
            self._settle()

        @precondition(lambda self: self.scheduler and self._decoding())
        @rule(pick=st.integers(0, MAX_LIVES - 1), abort=st.booleans())
        def finish(self, pick, abort):
            names = self._decoding()
            life = self.scheduler.lives[names[pick % len(names)]]
            upto = life.computed
            self.scheduler.finish(life, abort=abort)
            how = "aborted" if abort else "finished"
            self._say(f"{life.name}: {how}, insert {tokens(life.tokens[:upto])}")
            self._settle((life.name, life.tokens[:upto]))

        @precondition(lambda self: self.scheduler and self._decoding())
        @rule(pick=st.integers(0, MAX_LIVES - 1), evict_prompt=st.booleans())
        def retract(self, pick, evict_prompt):
            # SGLang retracts running requests in decode (``retract_decode``)
            names = self._decoding()
            life = self.scheduler.lives[names[pick % len(names)]]
            self.scheduler.retract(life)
            self._say(f"{life.name}: retracted (computed KV released, waits to resume)")
            self._settle()
            if evict_prompt:
                self.scheduler.evict(64)
                self._say("  GPU cache evicted before it resumes")
                self._settle()

        # The scheduler's own work between requests' steps: eviction pressure, delayed copies
        # completing. Always applicable, and the rule Hypothesis orders first (fewest
        # arguments): a step's rule draw shrinks towards the first rule, and where that one's
        # precondition failed (delivering with nothing in flight, a reset while requests hold
        # KV) the draw fell back to an index among the applicable rules, which deleting an
        # earlier step shifts. A reset is drawn with a new request (``reset_first``), when no
        # request holds KV, as ``flush_cache`` allows.
        @rule(tokens_=st.integers(0, 16), deliver=st.booleans())
        def background(self, tokens_, deliver):
            if tokens_:
                self.scheduler.evict(tokens_)
                self._say(f"evict {tokens_} GPU slots' worth")
                self._settle()
            if deliver and self.scheduler.recorder.in_flight():
                n = self.scheduler.recorder.deliver()
                self._say(f"{n} copies to host completed")
                self._settle()

        def _reset(self) -> None:
            self.scheduler.recorder.deliver()
            self.scheduler.writing_check()
            self.scheduler.reset()
            self.model.reset()
            for life in self.scheduler.lives.values():
                life.done = True
            self._say("reset (flush_cache): tree, slots and host copies cleared")

        @invariant()
        def due_pages_on_host(self):
            if self.scheduler is None:
                return
            missing = self.model.missing_backups()
            if missing:
                p = missing[0]
                who = sorted(self.model.inserters[p])
                raise divergence(
                    f"page {page(p)} inserted by {len(who)} distinct requests "
                    f"({', '.join(who)}), at least the threshold {self.model.threshold}, "
                    "is on the GPU with no host copy",
                    self.life,
                )

    SGLangCacheMachine.__name__ = SGLangCacheMachine.__qualname__ = (
        "SGLangCache_" + target.spec.replace("+", "_").replace("-", "_")
    )
    return SGLangCacheMachine
