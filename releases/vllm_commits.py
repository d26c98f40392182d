"""Upstream vLLM commits between releases, each staged over a release's environment and gated.

    python3 -m releases.vllm_commits list GITDIR [--json] # each commit and the release it follows
    python3 -m releases.vllm_commits run GITDIR [--since V] [--only SHA ...] [--results FILE]
                                            [--redo]

GITDIR is a bare clone of vLLM's main (no tags needed). A release is placed in that history by
its files: the commit that touched ``vllm/v1/kv_offload/`` whose package has the fewest files
that differ from the release's (its built environment's, else its wheel's), the latest on a tie.
Each commit that touched the package after a release is staged over a built release
(``.vllm/VERSION``): the one whose copy of the connector files the package imports
(``vllm/distributed/kv_transfer/...``, which a pull request often changes together with the
package) differs least from the commit's, by lines changed in the history; on a tie the nearest
earlier release, then the nearest later one; and the next where its environment does not
import the package. A throwaway virtual environment reads the release's site-packages (a
``.pth`` line, as releases/vllm_build.py does) and a finder first on ``sys.meta_path`` serves
the package ``vllm.v1.kv_offload`` from the commit's files (``git archive``), so the rest of
vLLM is the release's as installed. Then the default gate runs there, ``kvgate check --target vllm
--profile ci`` with one hash seed, and one JSON line a commit is appended to the results file
(docs/make_commits.py renders the table). Standard library only; the scratch lives under
``build/commits/``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from releases.vllm import ROOT, envs_dir, gate_facts
from releases.vllm_build import SWEEP, site_packages

PACKAGE = "vllm/v1/kv_offload"
MODULE = PACKAGE.replace("/", ".")
SCRATCH = ROOT / "build" / "commits"
WHEELS = ROOT / "build" / "wheels"
# A release whose package differs from every commit's in more files than this is not in the
# history at hand (a mirror that ends before it); 0.28.0 differs from upstream's last commit of
# the package in one file (a fix its release branch took).
NEAR = 3
GATE = ("-m", "kvgate", "check", "--target", "vllm", "--profile", "ci")


@dataclass(frozen=True)
class Commit:
    sha: str
    date: str  # the committer's date, YYYY-MM-DD
    title: str


def git(gitdir: Path, *args: str, binary: bool = False):
    done = subprocess.run(
        ["git", f"--git-dir={gitdir}", *args], capture_output=True, check=True, text=not binary
    )
    return done.stdout


def blob_id(data: bytes) -> str:
    """Git's id of a file's bytes (what ``git hash-object`` prints)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def package_commits(gitdir: Path, ref: str = "HEAD") -> list[Commit]:
    """The commits on ``ref`` that touched the package, oldest first."""
    out = git(gitdir, "log", "--reverse", "--format=%H%x1f%cs%x1f%s", ref, "--", PACKAGE)
    return [Commit(*line.split("\x1f", 2)) for line in out.splitlines() if line]


def commit_tree(gitdir: Path, sha: str) -> dict[str, str]:
    """``{path inside the package: blob id}`` of the package's Python files at ``sha``."""
    out = git(gitdir, "ls-tree", "-r", sha, "--", PACKAGE + "/")
    tree = {}
    for line in out.splitlines():
        meta, path = line.split("\t", 1)
        if path.endswith(".py"):
            tree[path[len(PACKAGE) + 1 :]] = meta.split()[2]
    return tree


def dir_tree(package: Path) -> dict[str, str]:
    """The same for a package installed in a folder."""
    return {
        p.relative_to(package).as_posix(): blob_id(p.read_bytes())
        for p in sorted(package.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def wheel_tree(wheel: Path) -> dict[str, str]:
    """The same for a release's wheel."""
    prefix = PACKAGE + "/"
    with zipfile.ZipFile(wheel) as zf:
        return {
            name[len(prefix) :]: blob_id(zf.read(name))
            for name in zf.namelist()
            if name.startswith(prefix) and name.endswith(".py")
        }


def release_tree(version: str) -> dict[str, str]:
    """The release's package: its built environment's, else its wheel's (fetched by pip into
    build/wheels, then kept)."""
    env_package = site_packages(envs_dir() / version) / PACKAGE
    if env_package.is_dir():
        return dir_tree(env_package)
    wheels = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not wheels:
        WHEELS.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary",
             ":all:", f"vllm=={version}", "-d", str(WHEELS)],
            check=True,
        )  # fmt: skip
        wheels = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    return wheel_tree(wheels[0])


def difference(a: dict[str, str], b: dict[str, str]) -> int:
    """How many files differ between two packages (present in one only, or with other bytes)."""
    return sum(a.get(p) != b.get(p) for p in set(a) | set(b))


def place(release: dict[str, str], trees: list[dict[str, str]]) -> tuple[int, int]:
    """``(index, files that differ)`` of the commit whose package is nearest the release's:
    the fewest differing files, the latest on a tie."""
    best = min(range(len(trees)), key=lambda i: (difference(release, trees[i]), -i))
    return best, difference(release, trees[best])


@dataclass
class Planned:
    commit: Commit
    follows: str  # the latest release placed before the commit
    candidates: list[str]  # built releases to stage over, in the order tried (by_coupling)
    drift: dict[str, int] = field(default_factory=dict)  # coupled lines that differ, a release


COUPLED = re.compile(r"^\s*(?:from|import)\s+(vllm\.distributed\.kv_transfer[\w.]*)", re.M)


def coupled_files(gitdir: Path, sha: str) -> list[str]:
    """The connector's files (outside the package) that the commit's package imports."""
    done = subprocess.run(
        ["git", f"--git-dir={gitdir}", "grep", "-h", "-F", "vllm.distributed.kv_transfer", sha,
         "--", PACKAGE],
        capture_output=True, text=True,
    )  # fmt: skip
    names = set(COUPLED.findall(done.stdout))
    tree = set(git(gitdir, "ls-tree", "-r", "--name-only", sha, "--", "vllm/distributed/").split())
    paths = {n.replace(".", "/") + end for n in names for end in (".py", "/__init__.py")}
    return sorted(paths & tree)


def drift(gitdir: Path, a: str, b: str, files: list[str]) -> int:
    """How many lines of ``files`` differ between two commits."""
    if not files:
        return 0
    out = git(gitdir, "diff", "--numstat", a, b, "--", *files)
    return sum(int(n) for line in out.splitlines() for n in line.split()[:2] if n.isdigit())


def by_coupling(gitdir: Path, planned: Planned, at: dict[str, str]) -> None:
    """Order the candidates by how far their connector is from the commit's (``at``: each
    release's commit), the nearest earlier release first on a tie (the order ``plan`` gave)."""
    files = coupled_files(gitdir, planned.commit.sha)
    planned.drift = {v: drift(gitdir, at[v], planned.commit.sha, files) for v in planned.candidates}
    planned.candidates.sort(key=planned.drift.__getitem__)


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def plan(
    commits: list[Commit], points: dict[str, int], built: list[str], since: str | None = None
) -> list[Planned]:
    """The commits after the oldest release's point that are not themselves a release's point,
    each with the release it follows and the built releases to stage it over (the nearest
    earlier first, then the later ones, nearest first). ``since`` keeps those after that
    release's point."""
    order = sorted(points, key=_vkey)
    first = points[since] if since else min(points.values(), default=len(commits))
    taken = set(points.values())
    out = []
    for i, commit in enumerate(commits):
        if i <= first or i in taken:
            continue
        follows = max((v for v in order if points[v] < i), key=lambda v: points[v])
        earlier = sorted((v for v in built if v in points and points[v] < i), key=points.get)
        later = sorted((v for v in built if v in points and points[v] > i), key=points.get)
        earlier.reverse()
        out.append(Planned(commit, follows, earlier + later))
    return out


FINDER = '''"""Serves {module} from a staged copy (releases/vllm_commits.py)."""
import importlib.machinery
import sys


class StagedPackage:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != {module!r}:
            return None
        return importlib.machinery.PathFinder.find_spec(name, [{parent!r}])


sys.meta_path.insert(0, StagedPackage)
'''


def stage(gitdir: Path, sha: str, release_env: Path, dest: Path) -> Path:
    """A throwaway environment at ``dest``: the release's site-packages, with the commit's
    package served first. Returns its python."""
    src = dest / "src"
    if not (src / PACKAGE).is_dir():
        data = git(gitdir, "archive", "--format=tar", sha, PACKAGE, binary=True)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(src, filter="data")
    venv = dest / "venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(
            [str(release_env / "bin" / "python"), "-m", "venv", "--without-pip", str(venv)],
            check=True,
        )
    sp = site_packages(venv)
    (sp / "_kvgate_release.pth").write_text(
        f"import site; site.addsitedir({str(site_packages(release_env))!r})\n"
    )
    parent = str((src / PACKAGE).parent)
    (sp / "_kvgate_staged.py").write_text(FINDER.format(module=MODULE, parent=parent))
    (sp / "_kvgate_staged.pth").write_text("import _kvgate_staged\n")
    return python


def clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_", "VIRTUAL_ENV"))
    }
    env.update(CI="true", PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
    return env


PROBE = """
import importlib, pathlib, sys
pkg = importlib.import_module({module!r})
staged = pathlib.Path(pkg.__path__[0]).resolve() == pathlib.Path({where!r}).resolve()
names = [{module!r} + "." + n for n in {names!r}]
for name in names:
    importlib.import_module(name)
print("staged" if staged else "not staged: " + str(pkg.__path__))
"""


def probe(python: Path, dest: Path, release_env: Path) -> str:
    """The empty string where the staged package and the release's connector import
    together; else the first line of why not."""
    package = dest / "src" / PACKAGE
    names = [n for n in ("base", "cpu.manager", "reuse_manager", "factory")
             if (package / (n.replace(".", "/") + ".py")).exists()]  # fmt: skip
    release_vllm = site_packages(release_env) / "vllm"
    connectors = release_vllm / "distributed" / "kv_transfer" / "kv_connector" / "v1"
    code = PROBE.format(module=MODULE, where=str(package), names=names)
    for path in sorted(connectors.rglob("*.py")):
        rel = path.relative_to(release_vllm.parent).with_suffix("")
        if "offloading" in rel.as_posix() and rel.name != "__init__":
            code += f"importlib.import_module({'.'.join(rel.parts)!r})\n"
    done = subprocess.run(
        [str(python), "-c", code], cwd=ROOT, env=clean_env(), capture_output=True, text=True
    )
    if done.returncode == 0 and done.stdout.strip().endswith("staged"):
        return ""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def verdict_of(out: str, rc: int) -> str:
    """The line that says what the gate concluded."""
    lines = out.strip().splitlines()
    if rc == 2:
        return next((ln for ln in lines if ln.strip()), "")
    fail = next((ln for ln in lines if ln.startswith("FAIL")), None)
    result = next((ln for ln in reversed(lines) if ln.startswith("result:")), None)
    return fail or result or (lines[-1] if lines else "")


IMPORT_TROUBLE = re.compile(r"ImportError|ModuleNotFoundError|cannot import name")


def run_gate(python: Path, timeout: int) -> tuple[str, int | None, float]:
    """The default gate in a staged environment: its output, exit status and seconds."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [str(python), *GATE], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        out, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        out, rc = f"timed out after {timeout} s\n{partial}", None
    return out, rc, round(time.monotonic() - start, 1)


def kvgate_state() -> str:
    """Which kvgate judged: its commit, and a digest of any uncommitted change to its code
    (the sweep runs the working tree, which others edit meanwhile)."""
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    diff = subprocess.run(
        ["git", "-C", str(ROOT), "diff", "HEAD", "--", "kvgate", "properties", "model", "impl"],
        capture_output=True,
    ).stdout
    if not diff:
        return head
    digest = hashlib.sha1(diff).hexdigest()[:8]
    kept = SCRATCH / f"kvgate-{head}+{digest}.diff"  # to run the same kvgate again
    if not kept.exists():
        SCRATCH.mkdir(parents=True, exist_ok=True)
        kept.write_bytes(diff)
    return f"{head}+{digest}"


def summary(out: str) -> dict:
    """What a reader of the table needs of the gate's output: the target's note line, the
    one line of an exit 2 or a run's error, and the divergence as printed (up to "calls
    before it")."""
    line = re.search(r"^(?:kvgate: |ERROR +\S+ x \S+: )(.*)$", out, re.MULTILINE)
    note = re.search(r"^target \S+: (.*)$", out, re.MULTILINE)
    div = re.search(r"^Divergence:.*?(?=^ calls before it|^shrunk steps|\Z)", out, re.M | re.S)
    return {
        "line": line[1] if line else "",
        "note": note[1] if note else "",
        "divergence": div[0].rstrip() if div else "",
    }


def gate(gitdir: Path, planned: Planned, envs: Path, timeout: int = 600) -> dict:
    """Stage the commit over each candidate release in turn and run the gate there; the first
    where the gate does not stop at an import (of the staged package, or of the release's
    connector beside it) gives the row."""
    sha = planned.commit.sha
    tried = []
    for version in planned.candidates:
        dest = SCRATCH / sha[:12] / version
        release_env = envs / version
        python = stage(gitdir, sha, release_env, dest)
        out, rc, seconds = run_gate(python, timeout)
        (dest / "out.txt").write_text(out)
        if rc in (0, 1) or not IMPORT_TROUBLE.search(out):
            break
        why = probe(python, dest, release_env)
        if not why:  # both import: the gate's import trouble is its own finding
            break
        tried.append(f"{version}: {why}")
    else:
        return {**asdict(planned.commit), "follows": planned.follows, "over": None,
                "tried": tried, "exit": None, "verdict": "no built release imports it",
                "why": "", "steps": None, "seconds": None, "line": "", "note": "",
                "divergence": "", "kvgate": kvgate_state(), "output": ""}  # fmt: skip
    facts = gate_facts(out)
    return {
        **asdict(planned.commit),
        "follows": planned.follows,
        "over": version,
        "tried": tried,
        "drift": planned.drift,
        "exit": rc,
        "verdict": verdict_of(out, rc if rc is not None else -1),
        "why": facts["why"],
        "steps": facts["steps"],
        "seconds": seconds,
        **summary(out),
        "kvgate": kvgate_state(),
        "output": str((dest / "out.txt").relative_to(ROOT)),
    }


def points_of(
    gitdir: Path, commits: list[Commit], versions: list[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """Each release's place among ``commits`` and how many files differ there."""
    trees = [commit_tree(gitdir, c.sha) for c in commits]
    points, differ = {}, {}
    for version in versions:
        index, n = place(release_tree(version), trees)
        differ[version] = n
        if n <= NEAR:
            points[version] = index
    return points, differ


def built_releases(envs: Path) -> list[str]:
    """The releases whose environment is finished (releases/vllm_build.py's mark, or a full
    environment .ci/vllm-venv built)."""
    done = [
        p.name
        for p in envs.iterdir()
        if re.fullmatch(r"[\d.]+", p.name)
        and ((p / ".ready").exists() or (p / "bin" / "kvgate").exists())
    ]
    return sorted(done, key=_vkey)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m releases.vllm_commits")
    parser.add_argument("mode", choices=["list", "run"])
    parser.add_argument("gitdir", type=Path)
    parser.add_argument("--since", help="only commits after this release's point")
    parser.add_argument("--only", nargs="*", default=[], help="commit id prefixes")
    parser.add_argument("--results", type=Path, default=SCRATCH / "results.jsonl")
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--json", action="store_true", help="list: one JSON line a commit")
    parser.add_argument("--redo", action="store_true", help="run: also commits already run")
    args = parser.parse_args(argv)
    if not (args.gitdir / "HEAD").exists():
        print(f"{args.gitdir}: not a git directory", file=sys.stderr)
        return 2
    if args.since and args.since not in SWEEP:
        print(f"--since {args.since}: not a release of the sweep ({', '.join(SWEEP)})")
        return 2
    envs = envs_dir()
    commits = package_commits(args.gitdir, args.ref)
    points, differ = points_of(args.gitdir, commits, SWEEP)
    built = built_releases(envs)
    planned = plan(commits, points, built, args.since)
    if args.only:
        planned = [p for p in planned if p.commit.sha.startswith(tuple(args.only))]
    at = {v: commits[i].sha for v, i in points.items()}
    for p in planned:
        by_coupling(args.gitdir, p, at)
    if args.mode == "list" and args.json:  # the sweep's scope, for docs/make_commits.py
        for p in planned:
            over = p.candidates[0] if p.candidates else None
            print(json.dumps({**asdict(p.commit), "follows": p.follows, "over": over}))
        return 0
    if args.mode == "list":
        for version in sorted(differ, key=_vkey):
            if version not in points:
                print(f"release {version}: not in this history ({differ[version]} files differ)")
                continue
            c = commits[points[version]]
            print(f"release {version}: {c.sha[:10]} {c.date} ({differ[version]} files differ)")
        for p in planned:
            over = p.candidates[0] if p.candidates else "-"
            print(f"{p.commit.sha[:10]} {p.commit.date} after {p.follows} over {over} "
                  f"{p.commit.title}")  # fmt: skip
        return 0
    SCRATCH.mkdir(parents=True, exist_ok=True)
    if args.results.exists() and not args.redo:  # a sweep goes on where it stopped
        done = {json.loads(ln)["sha"] for ln in args.results.read_text().splitlines() if ln}
        planned = [p for p in planned if p.commit.sha not in done]
    for i, p in enumerate(planned, 1):
        row = gate(args.gitdir, p, envs)
        with args.results.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"[{i}/{len(planned)}] {p.commit.sha[:10]} over {row['over']}: exit {row['exit']} "
              f"{row['verdict']}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
