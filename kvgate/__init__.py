"""kvgate: a property-based verification harness for KV-cache offloading managers.

How it works and why: docs/internals.md, section kvgate/__init__.py.
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
    """Where this ``kvgate/`` sits in a source tree with the three parts beside it, they are
    served from that tree and no other: first on the meta path, before an editable install's
    finder that may map them onto another checkout's folders (a second checkout run with the
    first one installed would otherwise mix trees, silently)."""
    tree = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    if not all(_os.path.isfile(_os.path.join(tree, part, "__init__.py")) for part in PARTS):
        return  # installed from a wheel, or staged with the parts inside kvgate/
    _sys.meta_path[:] = [f for f in _sys.meta_path if not isinstance(f, SourceTreeFinder)]
    _sys.meta_path.insert(0, SourceTreeFinder(tree))


_serve_the_source_tree()
