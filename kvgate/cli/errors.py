"""What ends a command with exit 2 and one line: usage errors, and argparse's errors on one
line."""

from __future__ import annotations

import argparse


class UsageError(Exception):
    """A bad flag, value or environment variable (exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as one ``UsageError`` line."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def one_line(text: str) -> str:
    """The first non-empty line of ``text``, stripped."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[0].strip() if lines else ""
