"""The targets tests/test_harness_errors.py plants (``vllm=tests.harness_stand_ins:NAME``): the
vLLM-shaped stand-in of tests/fake_vllm.py with one thing wrong each. They live apart from the
test module so that naming them as targets does not import that test module a second time
under another name (tests/test_layout.py)."""

from __future__ import annotations

from dataclasses import dataclass

from tests.fake_vllm import (  # noqa: F401 - the adapter reads the types off this module
    FakeEveryOfferCounts,
    FakeManager,
    LookupResult,
    ReqContext,
    make_offload_key,
)

# The stand-ins below are targets (vllm=tests.harness_stand_ins:NAME): this module defines
# ReqContext and make_offload_key (imported above), so the adapter takes its types from here.


class RaisesOnSecondOffer(FakeManager):
    """Raises inside the target on the second offer: the target's own crash."""

    def prepare_store(self, keys, req_context):
        self.offers = getattr(self, "offers", 0) + 1
        if self.offers == 2:
            raise KeyError("planted in the target")
        return super().prepare_store(keys, req_context)


class LookupAnswersNone(FakeManager):
    """A lookup whose ``None`` reaches the caller (the mutant of issue 31)."""

    def lookup(self, key, req_context) -> LookupResult:
        return None


class Without_get_stats(FakeManager):
    get_stats = None


class Without_reset_cache(FakeManager):
    reset_cache = None


# --- ill-formed answers, one call each (issue 48): each must be the target's counterexample,
# shrunk to a few steps, never "kvgate's own code raised"


class _Spec:
    """A load/store spec as a broken manager might build it: block_ids of its choosing."""

    def __init__(self, block_ids):
        self.block_ids = block_ids


class PrepareLoadAnswersNone(FakeManager):
    """``prepare_load`` returns nothing (a mutant of vLLM 0.34.0: the call's return dropped)."""

    def prepare_load(self, keys, req_context):
        super().prepare_load(keys, req_context)


class StoreSpecNone(FakeManager):
    """Every ``PrepareStoreOutput`` carries ``store_spec=None`` (the manager's load/store spec
    helper returns None)."""

    def prepare_store(self, keys, req_context):
        out = super().prepare_store(keys, req_context)
        if out is not None:
            out.store_spec = None
        return out


class StoreSpecFloats(FakeManager):
    """The store spec's ``block_ids`` are floats, not chunk ids."""

    def prepare_store(self, keys, req_context):
        out = super().prepare_store(keys, req_context)
        if out is not None:
            out.store_spec = _Spec([float(i) for i in out.store_spec.block_ids])
        return out


class StoreKeysNone(FakeManager):
    """``keys_to_store`` is None in an admitting answer."""

    def prepare_store(self, keys, req_context):
        out = super().prepare_store(keys, req_context)
        if out is not None:
            out.keys_to_store = None
        return out


class StoreAnswersAList(FakeManager):
    """``prepare_store`` answers the keys it stores as a bare list, not a PrepareStoreOutput."""

    def prepare_store(self, keys, req_context):
        out = super().prepare_store(keys, req_context)
        return None if out is None else list(out.keys_to_store)


class ConfigInfoAnswersNone(FakeManager):
    """``config_info()`` returns nothing (a mutant of vLLM 0.34.0)."""

    def config_info(self):
        super().config_info()


class PendingWorkAnswersNone(FakeManager):
    def has_pending_work(self):
        return None


class LoadSourceAnswersNone(FakeManager):
    def get_load_source(self, key, req_context):
        super().get_load_source(key, req_context)


class NewRequestAnswersNone(FakeManager):
    def on_new_request(self, req_context):
        super().on_new_request(req_context)


class EventsAnswersNone(FakeManager):
    """``take_events()`` returns None instead of an iterable (even an empty one)."""

    def take_events(self):
        list(super().take_events())
        return None


class StatsReduceNone(FakeManager):
    """``get_stats()`` answers a stats object whose ``reduce()`` gives nothing."""

    def get_stats(self):
        stats = super().get_stats()
        stats.reduce = lambda: None
        return stats


class StatsAnswersAString(FakeManager):
    def get_stats(self):
        return "no stats"


class TrackerCountsNone(FakeManager):
    """The tracker kvgate inspects holds None for every count."""

    @property
    def counts(self):
        counts = super().counts
        return None if counts is None else {k: None for k in counts}


ILL_FORMED = {
    "lookup": LookupAnswersNone,
    "prepare_load": PrepareLoadAnswersNone,
    "prepare_store store_spec None": StoreSpecNone,
    "prepare_store store_spec floats": StoreSpecFloats,
    "prepare_store keys_to_store None": StoreKeysNone,
    "prepare_store not an output": StoreAnswersAList,
    "config_info": ConfigInfoAnswersNone,
    "has_pending_work": PendingWorkAnswersNone,
    "get_load_source": LoadSourceAnswersNone,
    "on_new_request": NewRequestAnswersNone,
    "take_events": EventsAnswersNone,
    "get_stats reduce": StatsReduceNone,
    "get_stats": StatsAnswersAString,
    "the tracker": TrackerCountsNone,
}


# --- the interface learnt from each call (issue 47, item 1)


class CallsWithoutContext(FakeManager):
    """An upstream version between releases: the new module layout, but ``complete_store``,
    ``complete_load`` and ``touch`` still take no request context (called with one, kvgate
    crashed: "got multiple values for argument 'success'")."""

    def complete_store(self, keys, success: bool = True) -> None:
        super().complete_store(keys, None, success=success)

    def complete_load(self, keys) -> None:
        super().complete_load(keys, None)

    def touch(self, keys) -> None:
        super().touch(keys, None)

    def take_events(self):
        # its completions name no request, so neither do its events (no req_context field)
        for event in super().take_events():
            yield _PlainEvent(event.keys, event.removed, event.metadata_only)


@dataclass
class _PlainEvent:
    keys: list
    removed: bool
    metadata_only: bool = False


class StoreWithoutContext(FakeManager):
    """``prepare_store`` names no request: the admission rule cannot be judged (exit 2)."""

    def prepare_store(self, keys):
        return super().prepare_store(keys, ReqContext("anonymous"))


class StatsNoneBelowThreshold2(FakeManager):
    """``get_stats()`` answers None while the threshold is below 2 (the interface documents
    "None if disabled"): that release's answer, not a defect."""

    def get_stats(self):
        return None if self._m.store_threshold < 2 else super().get_stats()


class StatsNoneBelowThreshold2EveryOfferCounts(StatsNoneBelowThreshold2):
    """The same, over the every-offer-counts defect: the run goes on and finds that."""

    manager_cls = FakeEveryOfferCounts.manager_cls
