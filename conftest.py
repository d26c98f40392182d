"""Hypothesis profiles shared by every test and by the ``kvgate`` command, and one import of
every project module before any test runs.

``dev`` is the default on a laptop, ``ci`` (derandomized, so CI is deterministic) is chosen
automatically when ``CI`` is set, and ``thorough`` is the long run. ``HYPOTHESIS_PROFILE``
selects any of them explicitly.

Hypothesis biases generation with constants it finds in the project's loaded modules, so a
derandomized run draws different examples depending on which modules earlier tests happened
to import. Importing them all here gives every test process, whatever its share of the tests
under xdist, the same pool, and so the same examples.
"""
import importlib
import pkgutil

import bench
import kvgate.impl as impl
import kvgate.model as model
import kvgate.properties as properties
from kvgate.properties.profiles import load_profile

for _package in (impl, model, properties, bench):
    for _info in pkgutil.walk_packages(_package.__path__, _package.__name__ + "."):
        if not _info.name.endswith(("__main__", "run_all")):
            importlib.import_module(_info.name)

load_profile()
