"""Writing a generated part of a docs/ page: the spec's citations in it become links, in the one
form docs/cite.py writes (tests/test_spec.py holds every page to it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_cited(page: Path, text: str) -> None:
    """Write ``text`` to ``page`` (under docs/), its spec citations rewritten as links."""
    spec = importlib.util.spec_from_file_location("cite", ROOT / "docs" / "cite.py")
    assert spec is not None and spec.loader is not None
    cite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cite)
    page.write_text(cite.rewrite_file(page.relative_to(ROOT).as_posix(), text)[0])
