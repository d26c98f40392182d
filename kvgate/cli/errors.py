"""argparse's errors as one line: the command line's share of exit 2 (``UsageError`` itself is
the gate's, ``kvgate.gate.errors``)."""

from __future__ import annotations

import argparse

from kvgate.gate.errors import UsageError, one_line

__all__ = ["Parser", "UsageError", "one_line"]


class Parser(argparse.ArgumentParser):
    """argparse, with its errors raised as one ``UsageError`` line."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")
