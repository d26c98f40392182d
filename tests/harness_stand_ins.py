"""The targets tests/test_harness_errors.py plants (``vllm=tests.harness_stand_ins:NAME``): the
vLLM-shaped stand-in of tests/fake_vllm.py with one thing wrong each. They live apart from the
test module so that naming them as targets does not import that test module a second time
under another name (tests/test_layout.py)."""

from __future__ import annotations

from tests.fake_vllm import (  # noqa: F401 - the adapter reads the types off this module
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
