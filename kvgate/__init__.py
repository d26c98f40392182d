"""kvgate: a property-based verification harness for KV-cache offloading managers.

One import namespace. The tool itself (the ``kvgate`` command: ``kvgate.cli`` and what it
writes and replays) lives in this folder; the three parts it checks against each other keep
their own top-level folders and are importable only as parts of this package:

- ``kvgate.model``: the reference model (``model/``), plain Python;
- ``kvgate.impl``: the system under test (``impl/``): manager, policies, worker, scheduler driver;
- ``kvgate.properties``: what is checked and how (``properties/``): the lockstep oracle, state
  machines, targets and adapters, the catalogue of known-bad variants.

How a name resolves (this is the one account of it):

- installed (a wheel, or ``pip install -e .``): setuptools' ``package-dir`` maps the three names
  onto the three folders;
- a tree where the three are real subfolders of ``kvgate/`` (the staged copy that
  ``bench.mutation`` gives mutmut): ordinary packages;
- a plain source tree that was never installed (a checkout, a copy of one): the finder below
  maps exactly ``kvgate.model``, ``kvgate.impl`` and ``kvgate.properties`` onto the folders
  beside this one, and nothing else (no ``kvgate.tests``, ``kvgate.bench`` or ``kvgate.kvgate``).

Each of the three packages refuses to be imported under another name (``import impl`` from the
tree's root), so that no module is ever loaded twice, as two copies of every class in it.
"""

from __future__ import annotations

import importlib.abc as _abc
import importlib.util as _util
import os as _os
import sys as _sys

__version__ = "0.2.0"

PARTS = ("model", "impl", "properties")  # the folders that are kvgate.<part>


class SourceTreeFinder(_abc.MetaPathFinder):
    """Finds ``kvgate.<part>`` for the ``PARTS`` in the folders of one source tree."""

    def __init__(self, tree: str):
        self.tree = tree

    def find_spec(self, fullname, path=None, target=None):
        package, _, part = fullname.partition(".")
        if package != __name__ or part not in PARTS:
            return None
        folder = _os.path.join(self.tree, part)
        return _util.spec_from_file_location(
            fullname, _os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )


def _serve_the_source_tree() -> None:
    tree = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    if not all(_os.path.isfile(_os.path.join(tree, part, "__init__.py")) for part in PARTS):
        return
    if not any(isinstance(f, SourceTreeFinder) for f in _sys.meta_path):  # once, also on reload
        _sys.meta_path.append(SourceTreeFinder(tree))


if _util.find_spec(__name__ + ".model") is None:  # neither installed nor staged
    _serve_the_source_tree()
