"""Hypothesis profiles shared by every test and by the ``kvgate`` command.

``dev`` is the default on a laptop, ``ci`` (derandomized, so CI is deterministic) is chosen
automatically when ``CI`` is set, and ``thorough`` is the long run. ``HYPOTHESIS_PROFILE``
selects any of them explicitly.
"""
from properties.profiles import load_profile

load_profile()
