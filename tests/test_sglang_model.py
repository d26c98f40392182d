"""model/radix.py, SGLang's rule for which radix pages are due on host (spec §11), on fixed
examples; each rule also runs against a known-bad model that breaks it, and must fail there.

Imports nothing from SGLang: it runs in the main environment.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvgate.model.radix import RadixModel, pages_of

P = (1, 2, 3, 4)  # one prompt; its pages are its prefixes (page size 1)


# --- known-bad models, one per rule -----------------------------------------------------------


class CountsEveryInsert(RadixModel):
    """Every insert counts, as if each were a new request (a chunk, the insert at finish)."""

    def insert(self, request, tokens):
        self.serial = getattr(self, "serial", 0) + 1
        super().insert(f"{request}#{self.serial}", tokens)


class KeepsCountOffTheTree(RadixModel):
    """A page evicted from the GPU with no host copy keeps its requests."""

    def evicted(self, pages):
        return None


class CountsOffTheGPU(RadixModel):
    """Inserts count on a page that is on host only (evicted from the GPU)."""

    def insert(self, request, tokens):
        for page in pages_of(tokens, self.page_size):
            self.inserters.setdefault(page, set()).add(request)


class ResetKeepsCounts(RadixModel):
    """A reset drops the host copies but not the counts."""

    def reset(self):
        self.on_host.clear()


class CountsPartialPages(RadixModel):
    """The tail that fills no whole page counts as a page."""

    def insert(self, request, tokens):
        super().insert(request, tokens)
        if len(tokens) % self.page_size:
            self.inserters.setdefault(tuple(tokens), set()).add(request)


class DueBelowThreshold(RadixModel):
    """A page is due one request below the threshold."""

    def due(self, page):
        return self.count(page) >= self.threshold - 1


# --- the rules, each a check on a model class ---------------------------------------------------


def one_request_counts_once(model_cls: type[RadixModel]) -> None:
    """A request's chunks, its checkpoint, its insert at finish and its inserts after a
    retraction and resumption are one request: its pages are not due on it alone."""
    m = model_cls(threshold=2)
    m.insert("A", P[:2])  # chunk 1
    m.insert("A", P)  # chunk 2, the end of prefill
    m.insert("A", P)  # finish (or resumed after a retraction)
    assert [m.count(p) for p in pages_of(P, 1)] == [1, 1, 1, 1]
    assert not any(m.due(p) for p in pages_of(P, 1))
    assert m.missing_backups() == []
    m.insert("B", P[:3])
    assert [m.due(p) for p in pages_of(P, 1)] == [True, True, True, False]
    assert m.missing_backups() == [P[:1], P[:2], P[:3]]


def threshold_is_distinct_requests(model_cls: type[RadixModel]) -> None:
    m = model_cls(threshold=3)
    m.insert("A", P)
    m.insert("B", P)
    assert not m.due(P) and m.count(P) == 2
    m.backed_up([P])
    assert m.wrong_backups() == [P]  # backed up on two requests of three
    m.insert("C", P)
    assert m.due(P) and m.wrong_backups() == []


def leaving_the_tree_drops_the_count(model_cls: type[RadixModel]) -> None:
    """A page evicted with no host copy leaves the tree; its count goes with it."""
    m = model_cls(threshold=2)
    m.insert("A", P)
    m.evicted([P])
    m.insert("B", P)
    assert m.count(P) == 1 and not m.due(P)
    assert m.count(P[:3]) == 2  # its parent stayed


def no_count_while_only_on_host(model_cls: type[RadixModel]) -> None:
    """A page backed up and then evicted from the GPU is on host only: inserts do not count
    there (SGLang counts on GPU nodes), and it is never due again nor missing."""
    m = model_cls(threshold=2)
    m.insert("A", P)
    m.insert("B", P)
    m.backed_up(pages_of(P, 1))
    m.evicted([P])
    m.insert("C", P)
    assert m.count(P) == 0 and m.missing_backups() == [] and m.wrong_backups() == []


def reset_starts_over(model_cls: type[RadixModel]) -> None:
    m = model_cls(threshold=2)
    m.insert("A", P)
    m.backed_up([P[:1]])
    m.reset()
    m.insert("B", P)
    assert m.count(P) == 1 and not m.due(P[:1]) and m.on_host == set()


def whole_pages_only(model_cls: type[RadixModel]) -> None:
    m = model_cls(threshold=2, page_size=2)
    m.insert("A", (1, 2, 3))
    m.insert("B", (1, 2, 3))
    assert pages_of((1, 2, 3), 2) == [(1, 2)]
    assert m.missing_backups() == [(1, 2)]


def ancestors_cover_their_pages(model_cls: type[RadixModel]) -> None:
    """Whatever the inserts, a page's requests are a subset of its parent's: backing a page
    up with its ancestors (the host copy stays a prefix) never backs one up below the
    threshold."""
    m = model_cls(threshold=2)
    m.insert("A", (1, 2, 3))
    m.insert("B", (1, 2, 9))
    m.insert("A", (1, 2, 3, 4))
    m.insert("C", (1,))
    for page, who in m.inserters.items():
        if len(page) > 1:
            assert who <= m.inserters[page[:-1]], page
    assert [m.count(p) for p in pages_of((1, 2, 3, 4), 1)] == [3, 2, 1, 1]
    assert [m.due(p) for p in pages_of((1, 2, 3, 4), 1)] == [True, True, False, False]


RULES: dict[Callable[[type[RadixModel]], None], type[RadixModel]] = {
    one_request_counts_once: CountsEveryInsert,
    threshold_is_distinct_requests: DueBelowThreshold,
    leaving_the_tree_drops_the_count: KeepsCountOffTheTree,
    no_count_while_only_on_host: CountsOffTheGPU,
    reset_starts_over: ResetKeepsCounts,
    whole_pages_only: CountsPartialPages,
    ancestors_cover_their_pages: CountsEveryInsert,
}


@pytest.mark.parametrize("rule", list(RULES), ids=lambda r: r.__name__)
def test_the_model_keeps_the_rule(rule):
    rule(RadixModel)


@pytest.mark.parametrize("rule", list(RULES), ids=lambda r: r.__name__)
def test_a_model_that_breaks_the_rule_fails_it(rule):
    with pytest.raises(AssertionError):
        rule(RULES[rule])


def test_every_bad_model_breaks_a_rule():
    bad = {c for c in globals().values() if isinstance(c, type) and issubclass(c, RadixModel)}
    assert bad - {RadixModel} == set(RULES.values())
