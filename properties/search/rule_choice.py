"""How a machine picks its next rule: one integer draw among the rules whose preconditions hold,
weighted, with swarm testing. Hypothesis prints and replays the steps as usual.

Hypothesis's own rule strategy rejects disabled or invalid rules one draw at a time, which
costs a manager-machine step about a third of its time. ``WeightedRules`` evaluates the
preconditions once and draws once:

- **Weights.** A machine's ``RULE_WEIGHTS`` (rule name -> weight, 1 by default) spend the
  budget where bugs hide (offers, for the manager machine). Rules are listed in the weights'
  order, so shrinking (towards draw 0) prefers the first.
- **Swarm testing** (Groce et al., "Swarm Testing", ISSTA 2012). At its first step an example
  draws which optional rules it switches off (``SWARM_ALWAYS`` are never off). Draw 0 switches
  off none, so a counterexample shrinks towards every rule enabled. A step whose enabled rules
  all fail their preconditions falls back to every valid rule. The switched-off rules go into
  the machine's history (``rule="swarm"``), so coverage can require that swarm ran.

``install(machine)`` puts it in place of Hypothesis's strategy; on a Hypothesis without the
internals it relies on (``hypothesis_private`` beside this, where every one is named), the machine
keeps Hypothesis's own (slower, as correct).
"""

from __future__ import annotations

from typing import Any

from . import hypothesis_private as private


class WeightedRules(private.SearchStrategy):
    def __init__(self, machine: Any, weights: dict[str, int], always: frozenset[str]):
        super().__init__()
        self.machine = machine
        rules = {private.rule_name(r): r for r in private.machine_rules(type(machine))}
        order = [n for n in weights if n in rules] + sorted(n for n in rules if n not in weights)
        self.table = [(rules[n], n) for n in order for _ in range(weights.get(n, 1))]
        self.optional = [n for n in order if n not in always]
        self.off: frozenset[str] | None = None

    def _swarm(self, data) -> frozenset[str]:
        if not self.optional or not private.draw_integer(data, 0, 3):
            off: frozenset[str] = frozenset()
        else:
            mask = private.draw_integer(data, 0, (1 << len(self.optional)) - 1)
            off = frozenset(n for i, n in enumerate(self.optional) if mask >> i & 1)
        record = getattr(self.machine, "record", None)
        if record is not None:
            record("swarm", off=sorted(off))
        return off

    def do_draw(self, data):
        if self.off is None:
            self.off = self._swarm(data)
        m, off = self.machine, self.off
        ok: dict[str, bool] = {}
        for rule, name in self.table:
            if name not in ok:
                ok[name] = private.rule_ready(m, rule)
        valid = [(r, n) for r, n in self.table if ok[n] and n not in off] or [
            (r, n) for r, n in self.table if ok[n]
        ]
        rule, _ = valid[private.draw_integer(data, 0, len(valid) - 1)]
        return rule, {k: data.draw(s) for k, s in private.rule_arguments(rule).items()}


def install(machine: Any) -> None:
    """Pick ``machine``'s rules with ``WeightedRules`` (its class's ``RULE_WEIGHTS`` and
    ``SWARM_ALWAYS``), where this Hypothesis allows it."""
    if not private.can_replace_rule_strategy(machine):
        return
    private.replace_rule_strategy(
        machine,
        WeightedRules(
            machine,
            dict(getattr(machine, "RULE_WEIGHTS", {})),
            frozenset(getattr(machine, "SWARM_ALWAYS", ())),
        ),
    )
