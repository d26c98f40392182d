"""Every repository path that README.md or a page under docs/ names exists in the tree.

What counts as a path (the rule; a page's wording is never guessed at):

- **A link**: the target of ``[text](target)`` outside code, unless it is a URL (``http:``,
  ``https:``, ``mailto:``) or a bare ``#anchor``; resolved from the page's folder, its
  ``#anchor`` dropped.
- **In code** (inline spans and fenced blocks): a token (split at whitespace, ``=``, quotes,
  parentheses and commas) whose first component is a top-level folder of this repository
  (``bench/``, ``docs/``, ``kvgate/``, ``.ci/`` ...: git's view, so ``.vllm/`` and ``build/``,
  which are built, are not ours to name) followed by ``/``; and, in an inline span, a bare
  ``name.py``, which must be the name of some tracked file (a fenced block's bare names are
  mostly files its commands write, such as ``kvgate_repro.py``).
- **In prose** (and indented blocks): the same tokens when they end in ``/`` or their last
  component has a suffix (``bench/run_all.py``, ``impl/``); "one impl/vLLM ratio" is prose.
- vLLM's own files are named by their upstream path (``vllm/v1/kv_offload/...``), whose first
  component is no entry of this repository, so they are not checked. The one upstream folder
  whose first component is also ours, vLLM's test tree ``tests/v1/`` (where docs/adopt.md puts
  the gate file in a vLLM checkout), and a kvgate checkout inside vLLM's (docs/adopt.md's CI
  step) are listed in FOREIGN, each with its reason.
- A template (a token with ``<``, ``>``, ``$``, ``{`` or ``}``) is not checked; a glob (``*``,
  ``?``) must match at least one path; a pytest node id ``path::test[id]`` and a line number
  ``path:12`` are checked as the path, and so is ``page.md#anchor``.

A path exists when git tracks it (``git ls-files``: a clone's tree, not an ignored output or a
file not yet added) or it is a folder holding a tracked file.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Paths that belong to another tree, though their first component is one of ours: prefix -> why.
FOREIGN = {
    "tests/v1/": "vLLM's own test tree: the gate file a vLLM checkout adds (docs/adopt.md)",
    "kvgate/constraints.txt": "a kvgate checkout inside vLLM's, in docs/adopt.md's CI step",
}
TEMPLATE = re.compile(r"[<>${}]")
SPLIT = re.compile(r"[\s=\"'(),]+")
FENCE = re.compile(r"^ {0,3}(```+|~~~+)[^\n]*\n(.*?)^ {0,3}\1[ \t]*$", re.S | re.M)
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PROSE_PATH = re.compile(r"(?<![\w./-])[\w.-]+/[\w./*?-]*")


def tracked() -> tuple[set[str], set[str]]:
    """The tracked files and every folder that holds one (repository-relative, posix)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no tree to hold the pages to")
    files = {f for f in out.split("\0") if f}
    folders = {str(parent) for f in files for parent in PurePosixPath(f).parents}
    folders.discard(".")
    return files, folders


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def split_code(text: str) -> tuple[list[str], list[str], str]:
    """The page's fenced blocks, its inline code spans, and its prose with the code blanked."""
    fenced: list[str] = []
    inline: list[str] = []

    def take(into: list[str], match: re.Match[str]) -> str:
        into.append(match.group(2))
        return " "

    prose = FENCE.sub(lambda m: take(fenced, m), text)
    # a code span never crosses a blank line: match within each paragraph
    parts = [SPAN.sub(lambda m: take(inline, m), part) for part in re.split(r"\n\s*\n", prose)]
    return fenced, inline, "\n\n".join(parts)


def clean(token: str) -> str:
    """A token as a path: punctuation around it, a node id's test, an anchor, a line dropped."""
    token = token.split("::")[0].split("#")[0].strip(".,;:[]")
    return re.sub(r":\d+$", "", token)


def candidates(page: Path, top: set[str]) -> list[str]:
    """The repository paths ``page`` names (see the module docstring), as written there."""
    fenced, inline, prose = split_code(page.read_text(encoding="utf-8"))
    found: list[str] = []

    def ours(token: str) -> bool:
        return "/" in token and token.split("/")[0] in top

    for chunks, bare in ((fenced, False), (inline, True)):
        for token in (clean(t) for chunk in chunks for t in SPLIT.split(chunk)):
            if ours(token) or (bare and re.fullmatch(r"[\w-]+\.py", token)):
                found.append(token)
    for token in map(clean, PROSE_PATH.findall(LINK.sub("]", prose))):
        last = token.rstrip("/").rsplit("/", 1)[-1]
        if ours(token) and (token.endswith("/") or "." in last.lstrip(".")):
            found.append(token)
    for target in LINK.findall(prose):
        if target.startswith(("http:", "https:", "mailto:", "#")):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        try:
            found.append(path.relative_to(ROOT).as_posix() + ("/" if target.endswith("/") else ""))
        except ValueError:
            found.append(target.split("#")[0])  # out of the repository: nothing in it
    return found


def exists(path: str, files: set[str], folders: set[str]) -> bool:
    """Whether ``path`` (a file, a folder, a bare module name or a glob) is in the tree."""
    if "/" not in path:
        if path.endswith(".py"):
            return any(f.rsplit("/", 1)[-1] == path for f in files)
        return path in files or path in folders
    bare = path.rstrip("/")
    if any(c in bare for c in "*?"):
        return bool(fnmatch.filter(files | folders, bare))
    return (bare in files and not path.endswith("/")) or bare in folders


def missing(files: set[str], folders: set[str]) -> list[str]:
    """``page: path`` for every named path that is not in the tree."""
    top = {f.split("/")[0] for f in files if "/" in f}
    out = []
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        for path in dict.fromkeys(candidates(page, top)):
            if TEMPLATE.search(path) or path.startswith(tuple(FOREIGN)):
                continue
            if not exists(path, files, folders):
                out.append(f"{name}: {path}")
    return out


def test_every_path_a_page_names_exists():
    files, folders = tracked()
    gone = missing(files, folders)
    assert not gone, "pages name paths the tree does not hold:\n" + "\n".join(gone)


def test_the_rule_sees_each_kind_of_path(tmp_path):
    """The reader finds links, code paths, prose paths and bare modules, and skips the rest."""
    page = tmp_path / "page.md"
    page.write_text(
        "See [a guide](guide.md#top), `docs/gone.py`, `pytest tests/x.py::t[a/b]`, `gone.py`\n"
        "and bench/old.py; one impl/vLLM ratio; `vllm/v1/kv_offload/cpu.py`, `tests/v1/y.py`,\n"
        "`bench/results/$(date +%F).md`.\n\n```\npython docs/make_gone.py\n```\n"
    )
    top = {"docs", "tests", "bench", "impl"}
    got = candidates(page, top)
    first = ["docs/make_gone.py", "docs/gone.py", "tests/x.py", "gone.py", "tests/v1/y.py"]
    assert got[:5] == first  # the fenced block, then the inline spans in order
    assert "bench/old.py" in got and "impl/vLLM" not in got
    assert not any(p.startswith("vllm/") for p in got)
    assert got[-1] == "guide.md"  # a link out of the repository: kept as written, so flagged
    files = {"docs/make_tree.py", "tests/x.py"}
    folders = {"docs", "tests"}
    assert exists("tests/x.py", files, folders) and exists("docs/", files, folders)
    assert exists("make_tree.py", files, folders) and not exists("gone.py", files, folders)
    assert exists("docs/make_*.py", files, folders) and not exists("tests/x.py/", files, folders)
