"""A pytest plugin (``-p vllm_yardstick``, with this folder on ``PYTHONPATH``) for the connector
suite of ``python -m bench.mutation`` (docs/mutation.md): it loads a mutant of vLLM's offloading
connector's scheduler side in place of the installed file, and lets vLLM's own connector unit
tests (from the release's source distribution) run on a CPU, offline.

- ``KVGATE_CONNECTOR_MUTANT=PATH``: the file ``PATH`` is loaded as
  ``vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler`` (a finder first on
  ``sys.meta_path``), before anything imports the installed one. kvgate's own runs of the
  suite call ``install_mutant()`` from tests/mutation/test_vllm_connector.py; vLLM's tests get
  it from this plugin, which pytest loads before any conftest.
- For vLLM's tests (``KVGATE_VLLM_YARDSTICK=1``): vLLM picks its CPU platform
  (``VLLM_TARGET_DEVICE=cpu``; without it a CPU-only wheel finds no platform, and the hybrid
  KV-cache manager that the sliding-window and Mamba tests build is refused), and the CPU
  platform's check that x86 has Triton is answered yes (no Triton kernel runs in these
  scheduler-level tests). The model config those tests name must be in a local Hugging Face
  cache (bench/mutation.py writes one) and the hub is offline.

It stands alone (nothing from kvgate or ``tests``): vLLM's tests have a ``tests`` package too.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler"
MUTANT_VARIABLE = "KVGATE_CONNECTOR_MUTANT"


class _MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, path: str):
        self.path = path

    def find_spec(self, fullname, path=None, target=None):
        if fullname == MODULE:
            return importlib.util.spec_from_file_location(fullname, self.path)
        return None


def install_mutant() -> str | None:
    """Load the mutant ``KVGATE_CONNECTOR_MUTANT`` names from now on (``None``: none named)."""
    path = os.environ.get(MUTANT_VARIABLE)
    if not path:
        return None
    if MODULE in sys.modules:
        raise RuntimeError(f"{MODULE} already imported: too late to load the mutant")
    if not any(isinstance(f, _MutantFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MutantFinder(path))
    return path


if os.environ.get("KVGATE_VLLM_YARDSTICK") == "1":
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    install_mutant()
    import vllm.triton_utils as _triton_utils

    _triton_utils.HAS_TRITON = True  # CpuPlatform's x86 check (see the module docstring)


def pytest_configure(config):
    for mark in ("cpu_test", "skip_global_cleanup"):  # marks vLLM's own conftest registers
        config.addinivalue_line("markers", mark)
