"""Where the SGLang releases are: one small environment per release on one shared base.

``.sglang/base`` is a virtual environment with a CPU torch, kvgate (editable), Hypothesis,
pytest and the pure-Python packages SGLang's imports need (``BASE_PACKAGES``); it loads the
stand-ins of ``releases/sglang_standins.py`` at start-up. ``.sglang/VERSION`` is an environment
without pip whose one ``.pth`` line adds the base's packages, with the release installed by
``pip install --no-deps --target`` (spec §11, docs/sglang.md), the release's own pins beside it
(``PINS``), the stand-ins as this tree has them (a copy that shadows the base's), and the
GPU-only packages that release imports at module level stood in for (``STAND_INS``).
``KVGATE_SGLANG_ENVS`` names another folder than ``.sglang``. No SGLang environment is built
by CI: a test that needs one skips where it is absent.

``python3 releases/sglang.py build VERSION`` builds one on an existing base;
``python3 releases/sglang.py list`` prints the releases built here, one a line.
Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = f"python{sys.version_info.major}.{sys.version_info.minor}"
BASE_PACKAGES = (
    "numpy msgspec orjson psutil pybase64 requests packaging pillow starlette pydantic pyzmq "
    "tqdm ipython aiohttp transformers dill apache-tvm-ffi sentencepiece compressed-tensors "
    "gguf openai partial-json-parser datasets triton xgrammar httpx"
).split()

# What a release needs beside the base, installed into its own environment (they shadow the
# base's); base packages it must not import (a module there that raises ImportError); and
# GPU-only packages it imports at module level, stood in for (releases/sglang_standins.py).
_HUB_0 = ("tokenizers>=0.21,<0.22", "huggingface-hub<1.0", "kernels==0.9.0")
PINS = {
    "0.5.18": ("transformers==5.12.1", "tokenizers==0.22.2", "huggingface-hub<2"),
    "0.4.10.post2": ("transformers==4.54.1", *_HUB_0, "fastapi==0.116.1", "starlette<0.48"),
}
HIDDEN = {"0.5.18": ("kernels",)}
STAND_INS = {"0.4.10.post2": ("sgl_kernel",)}


def envs_dir() -> Path:
    return Path(os.environ.get("KVGATE_SGLANG_ENVS") or ROOT / ".sglang")


def release_python(version: str) -> Path | None:
    """The interpreter of ``version``'s environment, or None where it is not built."""
    python = envs_dir() / version / "bin" / "python"
    return python if python.exists() else None


def built() -> list[str]:
    """The releases with an environment here, oldest first."""
    found = [p.parent.parent.name for p in envs_dir().glob("*/bin/python")]
    found = [v for v in found if v != "base"]
    return sorted(found, key=lambda v: [int(x) if x.isdigit() else x for x in v.split(".")])


def site_packages(env: Path) -> Path:
    return env / "lib" / PY / "site-packages"


def build(version: str) -> Path:
    """``.sglang/VERSION`` on the base: a venv without pip, the base's packages by a ``.pth``
    line, the release's wheel alone (``--no-deps``)."""
    base = envs_dir() / "base"
    if not (base / "bin" / "python").exists():
        raise SystemExit(f"no SGLang base environment at {base} (docs/sglang.md says how)")
    env = envs_dir() / version
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = site_packages(env)
    (site / "_kvgate_base.pth").write_text(
        f"import site; site.addsitedir('{site_packages(base)}')\n"
    )
    subprocess.run(
        [str(base / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps",
         "--target", str(site), f"sglang=={version}", *PINS.get(version, ())],
        check=True,
    )  # fmt: skip
    # the stand-ins as this tree has them (shadowing the base's copy), and the release's own
    (site / "_kvgate_sglang_standins.py").write_text(
        (ROOT / "releases" / "sglang_standins.py").read_text()
    )
    if version in STAND_INS:
        names = ", ".join(repr(n) for n in STAND_INS[version])
        (site / "_kvgate_standins_more.pth").write_text(
            f"import _kvgate_sglang_standins as s; s.stand_in({names})\n"
        )
    for name in HIDDEN.get(version, ()):
        (site / f"{name}.py").write_text(
            f"raise ImportError('{name} is kept out of this SGLang environment "
            "(releases/sglang.py)')\n"
        )
    return env / "bin" / "python"


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"] and len(sys.argv) == 3:
        print(build(sys.argv[2]))
    elif sys.argv[1:] == ["list"]:
        print("\n".join(built()))
    else:
        raise SystemExit("usage: python3 releases/sglang.py build VERSION | list")
