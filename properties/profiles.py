"""Hypothesis settings profiles: ``dev``, ``ci``, ``thorough`` and ``crosshair``.

``crosshair`` runs tests on CrossHair's symbolic backend (hypothesis-crosshair): each example is
a path the solver picked, so fewer are needed; meant for the admission-level property tests.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, Phase, settings

from .search.hypothesis_private import stop_local_constants

# The phases every profile runs: all but explain, which costs 15-30 s per failing state machine
# and adds nothing to a shrunk program that already prints every step.
PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink)
# The first failure, as found: no example database, no targeting, no shrinking (the catch tests
# that skip shrinking for time, and the mutation runs, where a kill needs no short program).
FIRST_FAILURE = (Phase.explicit, Phase.generate)

# Draws must not depend on the literals of the modules a process loaded (the reason is at the
# function); on import, so that every run of kvgate and of its tests draws without them.
stop_local_constants()

_COMMON: dict[str, Any] = dict(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
    stateful_step_count=30,
    report_multiple_bugs=False,
    phases=PHASES,
)

settings.register_profile("dev", max_examples=200, **_COMMON)
settings.register_profile(
    "ci",
    max_examples=600,
    derandomize=True,
    database=None,
    print_blob=False,
    **{**_COMMON, "stateful_step_count": 40},
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    **{**_COMMON, "stateful_step_count": 50},
)
try:  # needs hypothesis-crosshair, a declared dependency; without it the other profiles work
    settings.register_profile(
        "crosshair", backend="crosshair", max_examples=100, database=None, **_COMMON
    )
    PROFILES: tuple[str, ...] = ("dev", "ci", "thorough", "crosshair")
except Exception:  # hypothesis.errors.InvalidArgument: backend not available
    PROFILES = ("dev", "ci", "thorough")


def default_profile() -> str:
    """``HYPOTHESIS_PROFILE`` if set, else ``ci`` when ``CI`` is set, else ``dev``."""
    name = os.environ.get("HYPOTHESIS_PROFILE")
    if name:
        if name not in PROFILES:
            raise ValueError(
                f"HYPOTHESIS_PROFILE={name!r} is not a kvgate profile; "
                f"set it to one of {', '.join(PROFILES)}, or unset it"
            )
        return name
    return "ci" if os.environ.get("CI") else "dev"


def load_profile(name: str | None = None) -> str:
    name = name or default_profile()
    settings.load_profile(name)
    return name


__all__ = ["FIRST_FAILURE", "PHASES", "PROFILES", "default_profile", "load_profile", "Phase"]
