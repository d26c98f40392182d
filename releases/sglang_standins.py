"""Stand-ins an SGLang release environment loads at start-up (a ``.pth`` line imports this).

Only GPU-only imports get one: the index's ``torchvision`` drags in a CUDA torch, and SGLang's
model configs import it at module level although the cache never uses it. The stand-in is a
package whose every attribute is another stand-in, and which reports a version. And a CPU
probe that older releases call and newer torch no longer has (``torch._C._cpu``'s AMX probe,
which 0.4.x's ``sglang.srt.utils`` calls at import) answers "no" where it is missing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STOOD_IN = {"torchvision"}  # a release's environment adds its own (releases/sglang.py)
CPU_PROBES = ("_is_amx_tile_supported",)  # torch._C._cpu functions torch 2.13 dropped


class _Anything(types.ModuleType):
    """A module (or attribute) that answers any attribute with another one, and any call."""

    __version__ = "0.0.0+kvgate.standin"
    __path__: list[str] = []

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _Anything(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        return _Anything(f"{self.__name__}()")

    def __mro_entries__(self, bases):
        return (object,)


def _missing_cpu_probes() -> None:
    import torch

    for name in CPU_PROBES:
        if not hasattr(torch._C._cpu, name):
            setattr(torch._C._cpu, name, lambda: False)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sglang.srt.utils":  # before it runs: the CPU probes it may call
            _missing_cpu_probes()
            return None
        if fullname.split(".", 1)[0] in STOOD_IN:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Anything(spec.name)
        module.__spec__ = spec
        return module

    def exec_module(self, module):
        return None


def stand_in(*names: str) -> None:
    """Stand in for these packages too (a release that imports GPU kernels at module level)."""
    STOOD_IN.update(names)


def install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
