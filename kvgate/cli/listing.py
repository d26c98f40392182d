"""``kvgate list``: the targets, catalogued variants, machines and profiles."""

from __future__ import annotations

import argparse
import importlib

from kvgate.gate import MACHINES, choose_profile
from kvgate.properties.profiles import PROFILES

# Each target kind and how it is judged (spec §9: exactly, or its open choices checked and
# adopted); tests/test_cli.py holds this to what spec §9 says of each kind.
EXACTLY, ADOPTED = "checked exactly", "its eviction and chunk-id choices checked and adopted"
TARGET_KINDS = (
    ("impl", "kvgate's manager, LRU and ARC (the default)", EXACTLY),
    ("impl:lru, impl:arc", "kvgate's manager under one policy", EXACTLY),
    ("mutant:NAME", "a known-bad variant from the catalogue (below)", EXACTLY),
    ("MODULE:ATTR", "a class or factory with kvgate's interface", EXACTLY),
    ("foreign=MODULE:ATTR", "the same, for a policy the spec does not describe", ADOPTED),
    ("vllm", "the installed vLLM release's CPUOffloadingManager, through an adapter", EXACTLY),
    ("vllm=MODULE:ATTR", "a class with vLLM's interface, e.g. a patched manager", EXACTLY),
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("list", help="name the targets, mutants and machines")
    p.set_defaults(func=cmd_list)
    return p


def machine_lines() -> list[str]:
    """Each machine: what it drives, the targets it is for, and why it cannot run here."""
    width = max(len(name) for name in MACHINES) + 2
    out = [
        "machines (--machine; without it `kvgate check` runs every machine below that "
        "applies to the target and can run here):"
    ]
    for m in MACHINES.values():
        why = m.unavailable()
        out.append(
            f"  {m.name:<{width}}{m.what}; for {m.targets}"
            + (f"; unavailable here: {why}" if why else "")
        )
    out.append(
        f"  {'all':<{width}}every machine that applies (what `kvgate check` runs "
        "without --machine; `kvgate mutants` runs manager unless told)"
    )
    return out


def cmd_list(args) -> int:
    from kvgate.properties.catalogue.managers import MUTANTS
    from kvgate.properties.engines.vllm.adapter import VLLM_MANAGER

    now = choose_profile(None)
    out = ["targets:"]
    out += [f"  {spec:<22} {what}: {judged}" for spec, what, judged in TARGET_KINDS]
    out.append("mutants (mutant:NAME):")
    for name, mutant in MUTANTS.items():
        doc = mutant.doc.split(". ")[0].rstrip(".")
        pol = "" if tuple(mutant.policies) == ("lru", "arc") else f" [{', '.join(mutant.policies)}]"
        out.append(f"  {name:<30} {doc}{pol}")
    out += machine_lines()
    out.append(f"profiles (--profile): {', '.join(PROFILES)} (now: {now})")
    try:
        importlib.import_module(VLLM_MANAGER)
        out.append("vllm: importable")
    except Exception as exc:
        out.append(
            f"vllm: not importable ({type(exc).__name__}); `kvgate check --target vllm` "
            "says how to install it"
        )
    print("\n".join(out))
    return 0
