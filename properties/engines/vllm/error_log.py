"""The connector reports an error only when something went wrong (issue 30, item 2).

The connector's scheduler side logs at ERROR level where it recovers from a failure (a
previous ``schedule()`` raised and left the manager's lock held). Operators alert on such
lines, so one logged in a run where no engine call raised is a false report: checked after
every step's metadata and every update (the run ends at the first engine call that raises, so
every line this watch sees is unexplained).

Its planted fault (a connector that reports a recovery nothing called for) is in faults.py.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from .checks import Checks


class _Lines(logging.Handler):
    """Every ERROR line of one logger, kept for the process (the logger outlives engines)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _lines_of(logger: logging.Logger) -> _Lines:
    for handler in logger.handlers:
        if isinstance(handler, _Lines):
            return handler
    handler = _Lines()
    logger.addHandler(handler)
    return handler


def connector_logger(conn: Any) -> logging.Logger | None:
    """The logger of the module that holds the connector's scheduler side."""
    logger = getattr(sys.modules.get(type(conn).__module__), "logger", None)
    return logger if isinstance(logger, logging.Logger) else None


class ErrorLog:
    """Watches the logger of the connector's scheduler module for ERROR lines."""

    def __init__(self, conn: Any, checks: Checks):
        self.checks = checks
        logger = connector_logger(conn)
        self.lines = _lines_of(logger) if logger is not None else None
        self.seen = len(self.lines.lines) if self.lines is not None else 0

    def check(self, when: str) -> None:
        if self.lines is None or len(self.lines.lines) <= self.seen:
            return
        line = self.lines.lines[self.seen]
        self.seen = len(self.lines.lines)
        self.checks.fail(
            f"the connector logged an error {when}, where no engine call failed: {line!r}"
        )
