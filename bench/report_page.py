"""Writing a generated part of a docs/ page: the spec's citations in it become links, in the one
form docs/cite.py writes (tests/test_spec.py holds every page to it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cite_module():
    """docs/cite.py (a script, not a package module), the one writer of the citation form."""
    spec = importlib.util.spec_from_file_location("cite", ROOT / "docs" / "cite.py")
    assert spec is not None and spec.loader is not None
    cite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cite)
    return cite


def cited(page: Path, text: str) -> str:
    """``text`` as ``page`` (under docs/) should hold it: its spec citations as links."""
    return cite_module().rewrite_file(page.relative_to(ROOT).as_posix(), text)[0]


def write_cited(page: Path, text: str) -> None:
    """Write ``text`` to ``page`` (under docs/), its spec citations rewritten as links."""
    page.write_text(cited(page, text))
