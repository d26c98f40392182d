"""Targets: what the gate checks, behind one small adapter interface.

A target spec names a manager: ``impl`` (both policies), ``impl:lru``, ``impl:arc``,
``mutant:NAME`` (a catalogued known-bad variant), ``MODULE:ATTR`` (a class or factory that
follows kvgate's interface, checked exactly like impl), ``foreign=MODULE:ATTR`` (the same, but
its eviction and chunk-id choices are its own: checked for legality and adopted), ``vllm`` (the
installed vLLM's ``CPUOffloadingManager``) and ``vllm=MODULE:ATTR`` (a class following vLLM's
interface). vLLM targets are foreign.

The records and the native adapter live in ``properties.adapters``; this module only turns
a spec into a ``Target``.
"""
from __future__ import annotations

from kvgate.impl.manager import OffloadingManager

from .adapters import (POLICIES, NativeAdapter, RequestHooks, Target, TargetError,  # noqa: F401
                       import_attr, missing_calls)


def resolve_target(spec: str) -> Target:
    """Turn a target spec into a ``Target``; raises ``TargetError`` with one line on failure."""
    if spec in ("impl", "impl:lru", "impl:arc"):
        policies = POLICIES if spec == "impl" else (spec.split(":")[1],)
        return Target(spec, OffloadingManager, policies)
    if spec.startswith("mutant:"):
        from .mutants import MUTANTS
        name = spec.split(":", 1)[1]
        if name not in MUTANTS:
            raise TargetError(f"unknown mutant {name!r}; `kvgate list` names them")
        return Target(spec, MUTANTS[name], MUTANTS[name].policies)
    if spec == "vllm" or spec.startswith("vllm="):
        from .vllm_adapter import resolve_vllm
        return resolve_vllm(spec)
    foreign = spec.startswith("foreign=")
    path = spec.split("=", 1)[1] if foreign else spec
    factory = import_attr(path)
    missing = missing_calls(factory) if isinstance(factory, type) else frozenset()
    return Target(spec, factory, POLICIES, foreign=foreign, missing=missing,
                  note=f"{spec}: lacks {', '.join(sorted(missing))} (never drawn)" if missing
                  else "")
