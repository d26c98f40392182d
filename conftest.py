"""Hypothesis profiles shared by every test and by the ``kvgate`` command.

``dev`` is the default on a laptop, ``ci`` (derandomized, so CI is deterministic) is chosen
automatically when ``CI`` is set, and ``thorough`` is the long run. ``HYPOTHESIS_PROFILE``
selects any of them explicitly. Tests that claim a catch or coverage name their profile
themselves. Loading the profiles also empties Hypothesis's pool of source-code constants
(``kvgate.properties.profiles``), so the examples a derandomized run draws do not depend on
which modules a test process imported.
"""
from kvgate.properties.profiles import load_profile

load_profile()
