"""Loads a staged copy of a vLLM release's CPU manager and policies in place of the installed
ones (the vLLM suites of ``python -m bench.mutation``; docs/mutation.md).

mutmut mutates files of the tree it runs in, and names a mutant after the file's path. The
vLLM suites stage ``vllm/v1/kv_offload/cpu/manager.py`` and ``vllm/v1/kv_offload/cpu/policies/``
from the installed release into that tree, with no ``__init__.py`` above them: ``import vllm``
still finds the installed package (a folder without ``__init__.py`` is only a namespace
portion, which a regular package found later on the path outranks). ``install`` then puts a
finder first on ``sys.meta_path`` that loads exactly those modules, under their real names,
from the staged files, so the trampolines mutmut wrote switch on under the names mutmut gave
them and everything else of vLLM is the installed release.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

PACKAGE = "vllm.v1.kv_offload.cpu"
RELATIVE = Path(*PACKAGE.split("."))
MANAGER = f"{PACKAGE}.manager"
POLICIES = f"{PACKAGE}.policies"


class _StagedFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: Path):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname == MANAGER:
            return importlib.util.spec_from_file_location(fullname, self.root / "manager.py")
        if fullname == POLICIES:
            folder = self.root / "policies"
            return importlib.util.spec_from_file_location(
                fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
            )
        return None  # the policies' modules are found through the staged package's path


def staged_root(where: Path) -> Path | None:
    """The staged package folder under ``where``, or None where nothing is staged."""
    root = where / RELATIVE
    return root if (root / "manager.py").is_file() else None


def install(where: Path) -> Path:
    """Load the staged manager and policies from ``where`` from now on (before vLLM's CPU
    manager is first imported, which the check below proves)."""
    root = staged_root(where)
    if root is None:
        raise RuntimeError(f"no vLLM manager staged under {where}")
    loaded = [m for m in sys.modules if m == MANAGER or m.startswith(POLICIES)]
    if loaded:
        raise RuntimeError(f"installed modules already imported, too late to stage: {loaded}")
    sys.meta_path.insert(0, _StagedFinder(root))
    return root
