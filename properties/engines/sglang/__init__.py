"""SGLang's hierarchical cache under kvgate's rule (issue 46): the target found by capability
(``target``; ``hiradix`` builds 0.5.18's ``HiRadixCache``), the copy recorder at its cache
controller (``recorder``), the scheduler's side of a request's life (``scheduler``), the machine
(``machine``), its variants (``variants``) and the counterexample text (``life``).
``resolve_sglang(spec)`` and ``make_machine(target)`` are what the gate calls."""

from __future__ import annotations

from .machine import make_machine
from .target import SGLangTarget, resolve_sglang
from .variants import KNOWN_BAD, VARIANTS

__all__ = ["KNOWN_BAD", "VARIANTS", "SGLangTarget", "make_machine", "resolve_sglang"]
