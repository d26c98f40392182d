"""What ends a gate with no verdict because the user asked for something wrong: ``UsageError``
(exit 2 and one line, in either front door), and the one-line form every such message takes."""

from __future__ import annotations


class UsageError(Exception):
    """A bad flag, value, option or environment variable (exit 2)."""


def one_line(text: str) -> str:
    """The first non-empty line of ``text``, stripped."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0].strip() if lines else ""
