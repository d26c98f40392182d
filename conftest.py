"""Hypothesis profiles shared by every test and by the ``kvgate`` command.

``dev`` is the default on a laptop, ``ci`` (derandomized, so CI is deterministic) is chosen
automatically when ``CI`` is set, and ``thorough`` is the long run. ``HYPOTHESIS_PROFILE``
selects any of them explicitly. Tests that claim a catch or coverage name their profile
themselves. Loading the profiles also empties Hypothesis's pool of source-code constants
(``kvgate.properties.profiles``), so the examples a derandomized run draws do not depend on
which modules a test process imported.
"""

import pytest

from kvgate.properties.profiles import load_profile


def pytest_configure(config):
    """Load the profile before any test module is collected (some read ``settings.default`` at
    import). An unknown ``HYPOTHESIS_PROFILE`` is a usage error: one line naming the variable
    and the valid profiles, not a traceback."""
    try:
        load_profile()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_runtest_makereport(item, call):
    """Where the release environments are required (``KVGATE_VLLM_REQUIRED=1``: .ci/run sets it
    after building every gated vLLM release), a vllm-marked test may not skip."""
    import os

    if os.environ.get("KVGATE_VLLM_REQUIRED") != "1" or item.get_closest_marker("vllm") is None:
        return None
    if call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception):
        from _pytest.reports import TestReport

        report = TestReport.from_item_and_call(item, call)
        report.outcome = "failed"
        report.longrepr = f"a vllm test skipped where vLLM is required: {call.excinfo.value}"
        return report
    return None
