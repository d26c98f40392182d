"""Building one environment per vLLM release (spec §10), on one shared base.

    python3 -m releases.vllm_build VERSION ...   # build them (network), a few at once

The CPU build of torch and the packages the managers import are installed once, in a base
environment (``.vllm/base``); each release's environment is a bare virtual environment whose
site-packages names the base's (a ``.pth`` file), holding only that release's wheel
(``--no-deps``) and kvgate (editable, ``--no-deps``). So a release costs its wheel, not another
torch. An environment .ci/vllm-venv built (a full one) is used as it is. Standard library only:
.ci/run runs it before anything is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from releases.vllm import ROOT, envs_dir

# Every minor release with vllm/v1/kv_offload, each at its last patch release, oldest first.
SWEEP = [
    "0.19.1", "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0",
    "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0",
]  # fmt: skip
TORCH = "torch==2.13.0"
# What the managers and the modules they import need, beyond torch (the list .ci/vllm-venv
# installs, and what older releases also import at module level).
COMMON = (
    "packaging psutil pyzmq urllib3 regex numpy transformers cbor2 aiohttp requests "
    "openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo "
    "prometheus_client xgrammar fastapi partial_json_parser llguidance gguf diskcache einops"
).split()


def sh(*cmd: str | Path, log) -> None:
    print("+", " ".join(map(str, cmd)), file=log, flush=True)
    subprocess.run([str(c) for c in cmd], check=True, stdout=log, stderr=subprocess.STDOUT)


def site_packages(env: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return env / "lib" / version / "site-packages"


def pip(env: Path, *args: str, log) -> None:
    sh(env / "bin" / "python", "-m", "pip", "install", "-q", "--no-cache-dir", *args, log=log)


def build_base(envs: Path, log) -> Path:
    base = envs / "base"
    if (base / ".ready").exists():
        return base
    sh(sys.executable, "-m", "venv", "--clear", base, log=log)
    pip(base, "--upgrade", "pip", log=log)
    pip(base, TORCH, log=log)
    pip(base, "-c", str(ROOT / "constraints.txt"), "-e", f"{ROOT}[test,mutation]", log=log)
    pip(base, "--no-warn-conflicts", "-c", str(ROOT / "constraints.txt"), *COMMON, log=log)
    (base / ".ready").write_text("")
    return base


def build_release(version: str, envs: Path, base: Path, log) -> Path:
    env = envs / version
    if (
        (env / ".ready").exists()
        or (env / "bin" / "kvgate").exists()
        and not (env / ".shared").exists()
    ):
        return env  # built before, here or by .ci/vllm-venv
    sh(sys.executable, "-m", "venv", "--clear", "--without-pip", env, log=log)
    # site.addsitedir, not a bare path line: the base's own .pth files (its editable kvgate,
    # among them) are read too.
    (site_packages(env) / "_kvgate_base.pth").write_text(
        f"import site; site.addsitedir({str(site_packages(base))!r})\n"
    )
    (env / ".shared").write_text(str(base) + "\n")
    py = env / "bin" / "python"
    sh(py, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-compile", "--no-deps",
       f"vllm=={version}", log=log)  # fmt: skip
    sh(py, "-m", "pip", "install", "-q", "--no-cache-dir", "--no-deps", "-e", ROOT, log=log)
    (env / ".ready").write_text("")
    return env


def build(versions: list[str], envs: Path) -> int:
    envs.mkdir(parents=True, exist_ok=True)
    with open(envs / "base.log", "a") as log:
        base = build_base(envs, log)

    def one(version: str) -> bool:
        with open(envs / f"{version}.log", "a") as log:
            # A download that fails once (the index, the network, a full disk that another
            # release's unpack filled and gave back) is tried once more from a clean env.
            for attempt in (1, 2):
                try:
                    build_release(version, envs, base, log)
                    break
                except subprocess.CalledProcessError as exc:
                    free = shutil.disk_usage(envs).free / 2**30
                    print(
                        f"vLLM {version}, try {attempt}: {exc}; {free:.1f} GiB free;"
                        f" see {envs / version}.log",
                        file=sys.stderr,
                        flush=True,
                    )
            else:
                return False
        print(f"vLLM {version} ready in {envs / version}", flush=True)
        return True

    # Each release is a download and an unpack: a few at once, as .ci/run wants them.
    with ThreadPoolExecutor(4) as pool:
        ok = list(pool.map(one, versions))
    return 0 if all(ok) else 1


def main(argv: list[str] | None = None) -> int:
    versions = list(sys.argv[1:] if argv is None else argv)
    if not versions:
        print("usage: python3 -m releases.vllm_build VERSION ...", file=sys.stderr)
        return 2
    return build(versions, envs_dir())


if __name__ == "__main__":
    raise SystemExit(main())
