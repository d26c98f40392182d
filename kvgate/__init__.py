"""kvgate: a property-based verification harness for KV-cache offloading managers.

One import namespace. The tool itself (the ``kvgate`` command: ``kvgate.cli`` and what it
writes and replays) lives in this folder; the three parts it checks against each other keep
their own top-level folders and are mapped under this package by setuptools' ``package-dir``:

- ``kvgate.model``: the reference model (``model/``), plain Python;
- ``kvgate.impl``: the system under test (``impl/``): manager, policies, worker, scheduler driver;
- ``kvgate.properties``: what is checked and how (``properties/``): the lockstep oracle, state
  machines, targets and adapters, the catalogue of known-bad variants.

An installed kvgate (a wheel, or ``pip install -e .``) finds them through that mapping. From a
plain source tree (a checkout that was never installed, or a mutation tool's copy of it) the
folder beside this one holds them, so the same names resolve there.
"""
from __future__ import annotations

import importlib.util as _util
import os as _os

__version__ = "0.2.0"

if _util.find_spec(__name__ + ".model") is None:  # not installed: serve the source tree
    _tree = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    if _os.path.isfile(_os.path.join(_tree, "model", "admission.py")):
        __path__.append(_tree)  # a package's own __path__
