"""Coverage labels, computed from a machine's recorded history (as quickcheck-state-machine tags
a history): one mechanism for every machine.

A machine that mixes in ``Recorded`` appends one entry per step to ``self.history`` (a dict:
``rule``, the step's name, and the facts it saw: what the target answered, what the model's
state was). The oracle's call log may share the list (its entries have no ``rule``).
Its class lists ``LABELS``: label -> predicate over one entry. At the end of each example the
labels its history earns are counted into the class's ``coverage`` counter (one per machine
class) and reported to Hypothesis as events; the runner reads ``coverage``, and the tests
require every label of ``expected_labels()`` to fire.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from hypothesis import event
from hypothesis.control import currently_in_test_context

Entry = dict[str, Any]
Predicate = Callable[[Entry], bool]


def labels_of(history: Iterable[Entry], labels: dict[str, Predicate]) -> Counter:
    """How many entries of ``history`` earn each label."""
    out: Counter = Counter()
    for entry in history:
        if "rule" not in entry:  # an oracle's call entry
            continue
        for label, earns in labels.items():
            if earns(entry):
                out[label] += 1
    return out


class Recorded:
    """A machine whose coverage labels come from its recorded history."""

    LABELS: dict[str, Predicate] = {}
    coverage: Counter = Counter()
    last_history: list[Entry] = []
    history: list[Entry]  # each machine makes its own in its __init__

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.coverage = Counter()  # every machine class counts its own runs

    @classmethod
    def expected_labels(cls) -> tuple[str, ...]:
        """The labels a passing run of this machine class must hit."""
        return tuple(cls.LABELS)

    def record(self, rule: str, **facts: Any) -> Entry:
        entry = {"rule": rule, **facts}
        self.history.append(entry)
        return entry

    def count_labels(self) -> None:
        """At the end of an example: count its labels and tell Hypothesis."""
        earned = labels_of(self.history, self.LABELS)
        type(self).coverage.update(earned)
        type(self).last_history = self.history
        if currently_in_test_context():
            for label in earned:
                event(label)
