"""Targets: turn a target spec into a ``Target`` (``properties.adapters`` holds the records and
the native adapter, ``properties.engines.vllm.adapter`` the vLLM one).

Specs: ``impl`` (both policies, both recency semantics), ``impl:lru``, ``impl:arc``,
``mutant:NAME`` (a catalogued known-bad variant), ``MODULE:ATTR`` (a class or factory that
follows kvgate's interface, checked exactly like impl), ``vllm`` (the installed vLLM's
``CPUOffloadingManager``, checked exactly) and ``vllm=MODULE:ATTR`` (a class following vLLM's
interface, checked exactly). ``foreign=`` before ``MODULE:ATTR``, ``vllm`` or
``vllm=MODULE:ATTR``: the manager's eviction and chunk-id choices are its own, checked for
legality and adopted (spec section 9). A ``MODULE:ATTR`` that follows vLLM's interface (a class
deriving from one of vLLM's, or defined beside vLLM-shaped ``ReqContext`` and
``make_offload_key``) is judged through vLLM's adapter, as ``vllm=MODULE:ATTR`` would be: driven
through kvgate's interface it would be blamed for answers that interface never asked of it.
"""

from __future__ import annotations

import dataclasses
import sys
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
    found = import_attr(rest)
    why = follows_vllm(found, rest)
    if why:
        from .engines.vllm.adapter import resolve_vllm

        target = resolve_vllm(f"vllm={rest}", foreign=foreign)
        said = f"{spec}: {why}, so judged as vllm={rest}"
        return dataclasses.replace(target, note="; ".join(x for x in (said, target.note) if x))
    return native_target(spec, found, foreign=foreign)


def follows_vllm(found, path: str) -> str:
    """Why ``found`` (what ``MODULE:ATTR`` names) follows vLLM's manager interface, or "": a
    class with a base from vLLM's package, or a class whose module defines the vLLM-shaped
    ``ReqContext`` and ``make_offload_key`` (a self-contained manager; kvgate's own interface
    has neither)."""
    for base in getattr(found, "__mro__", ())[1:]:
        name = str(getattr(base, "__module__", ""))
        if name == "vllm" or name.startswith("vllm."):
            return f"it derives from {name}.{base.__qualname__}"
    module = sys.modules.get(path.partition(":")[0])
    calls = ("lookup", "prepare_load", "prepare_store", "complete_store")  # a manager at all
    if (
        isinstance(found, type)
        and not issubclass(found, OffloadingManager)  # kvgate's own manager, extended
        and all(hasattr(module, n) for n in ("ReqContext", "make_offload_key"))
        and all(callable(getattr(found, n, None)) for n in calls)
    ):
        return "its module defines vLLM's ReqContext and make_offload_key"
    return ""
