"""The registry of machines the gate can run (``MACHINES``): how each is built for a target,
which targets it is for, and whether it can run here (each "no" one line saying why)."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from kvgate.properties.adapters import Target

from .errors import UsageError, one_line


@dataclass(frozen=True)
class Machine:
    """One machine the gate can run: how to build it for a target, the targets it is for,
    and whether it can be built here; each "no" is one line saying why."""

    name: str
    what: str  # one line for `kvgate list`
    build: Callable[[Target], type]
    targets: str = "every manager target"  # which targets it is for, in words
    not_for: Callable[[Target], str | None] = lambda target: None
    unavailable: Callable[[], str | None] = lambda: None
    install: Callable[[], str] = lambda: ""  # what makes it available, when it is not
    engine: str = ""  # an engine's own targets (their ``engine``) alone: "sglang"; "" the rest


def _manager(target: Target):
    from kvgate.properties.manager_machine import make_machine

    return make_machine(target)


def _scheduler(target: Target):
    from kvgate.properties.scheduler_machine import make_machine

    return make_machine(target)


VLLM_SCHEDULER_MODULE = "kvgate.properties.engines.vllm.machine"


def _vllm_scheduler(target: Target):
    return importlib.import_module(VLLM_SCHEDULER_MODULE).make_machine(target)


def _is_vllm_target(target: Target) -> bool:
    """A target with vLLM's interface (``vllm``, ``vllm=MODULE:ATTR``, either foreign)."""
    return not engine_of(target) and not target.kvgate_interface


def engine_of(target) -> str:
    """``sglang`` for an SGLang target (a cache, not a manager), ``""`` for a manager target."""
    return getattr(target, "engine", "")


SGLANG_MODULE = "kvgate.properties.engines.sglang"


def _sglang(target):
    return importlib.import_module(SGLANG_MODULE).make_machine(target)


def _sglang_unavailable() -> str | None:
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not importable (it lives in a release environment: docs/sglang.md)"
    return None


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(str(exc))}".rstrip(": ")


def _vllm_missing() -> str | None:
    """Why the installed vLLM cannot be used, or None."""
    from kvgate.properties.engines.vllm.adapter import VLLM_MANAGER

    try:
        importlib.import_module(VLLM_MANAGER)
    except Exception as exc:
        return f"vLLM is not importable ({_said(exc)})"
    return None


def _vllm_scheduler_unavailable() -> str | None:
    """vLLM first (what a user must install); then the machine's module, which may not exist
    in this tree yet (an ImportError of that very module); then what the module says."""
    missing = _vllm_missing()
    if missing:
        return missing
    try:
        module = importlib.import_module(VLLM_SCHEDULER_MODULE)
    except ImportError as exc:
        if exc.name == VLLM_SCHEDULER_MODULE:
            return f"not built in this kvgate yet: {VLLM_SCHEDULER_MODULE} does not exist"
        return f"{VLLM_SCHEDULER_MODULE} does not import ({_said(exc)})"
    return module.unavailable_reason()


def _vllm_install() -> str:
    """How to install a release (spec §10), when vLLM is what is missing."""
    from kvgate.properties.engines.vllm.adapter import INSTALL_HINT

    return INSTALL_HINT if _vllm_missing() else ""


MACHINES: dict[str, Machine] = {
    m.name: m
    for m in (
        Machine("manager", "manager vs model in lockstep, call by call (the quick path)", _manager),
        Machine(
            "scheduler",
            "requests through kvgate's scheduler driver, every manager call checked",
            _scheduler,
        ),
        Machine(
            "vllm-scheduler",
            "requests through vLLM's own scheduler and offloading "
            "connector, every manager call checked",
            _vllm_scheduler,
            targets="vllm and vllm=MODULE:ATTR targets",
            not_for=lambda t: (
                None
                if _is_vllm_target(t)
                else "it drives vLLM's own scheduler, so only vllm and vllm=MODULE:ATTR targets"
            ),
            unavailable=_vllm_scheduler_unavailable,
            install=_vllm_install,
        ),
        Machine(
            "sglang",
            "request lives through SGLang's own hierarchical radix cache, every backup "
            "checked against the radix model",
            _sglang,
            targets="sglang and sglang+VARIANT targets",
            unavailable=_sglang_unavailable,
            engine="sglang",
        ),
    )
}


def build_machine(kind: str, target: Target):
    """The machine class of ``kind`` checking ``target``, named as Hypothesis prints it."""
    if kind not in MACHINES:
        raise UsageError(f"unknown machine {kind!r}; one of {', '.join(MACHINES)}")
    return MACHINES[kind].build(target)
