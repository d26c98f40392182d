"""Targets: turn a target spec into a ``Target`` (``properties.adapters`` holds the records and
the native adapter, ``properties.engines.vllm.adapter`` the vLLM one).

Specs: ``impl`` (both policies, both recency semantics), ``impl:lru``, ``impl:arc``,
``mutant:NAME`` (a catalogued known-bad variant), ``MODULE:ATTR`` (a class or factory that
follows kvgate's interface, checked exactly like impl), ``vllm`` (the installed vLLM's
``CPUOffloadingManager``, checked exactly) and ``vllm=MODULE:ATTR`` (a class following vLLM's
interface, checked exactly). ``foreign=`` before ``MODULE:ATTR``, ``vllm`` or
``vllm=MODULE:ATTR``: the manager's eviction and chunk-id choices are its own, checked for
legality and adopted (spec section 9).
"""

from __future__ import annotations

from typing import cast

from kvgate.impl.manager import OffloadingManager

from .adapters import POLICIES, RECENCIES, Target, TargetError, import_attr, native_target


def resolve_target(spec: str) -> Target:
    """Turn a target spec into a ``Target``; raises ``TargetError`` with one line on failure."""
    if spec in ("impl", "impl:lru", "impl:arc"):
        policies = POLICIES if spec == "impl" else (spec.split(":")[1],)
        return Target(spec, OffloadingManager, policies, recencies=RECENCIES, takes_recency=True)
    if spec.startswith("mutant:"):
        from .catalogue.managers import MUTANTS

        name = spec.split(":", 1)[1]
        if name not in MUTANTS:
            raise TargetError(f"unknown mutant {name!r}; `kvgate list` names them")
        mutant = MUTANTS[name]
        return Target(spec, mutant, mutant.policies, recencies=mutant.recencies, takes_recency=True)
    if spec.partition("+")[0] == "sglang":  # SGLang's cache, not a manager (spec §11)
        from .engines.sglang import resolve_sglang

        # an SGLangTarget has what the gate reads of a target (spec, note, unchecked ...)
        return cast(Target, resolve_sglang(spec))
    foreign = spec.startswith("foreign=")
    rest = spec.split("=", 1)[1] if foreign else spec
    if rest == "vllm" or rest.startswith("vllm="):
        from .engines.vllm.adapter import resolve_vllm

        return resolve_vllm(rest, foreign=foreign)
    return native_target(spec, import_attr(rest), foreign=foreign)
