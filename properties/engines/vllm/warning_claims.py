"""**Warnings that say what happened**: each WARNING line of the connector's scheduler side
whose claim kvgate can check holds (an operator acts on it: an alert, a support ticket).


- "cannot store chunks": ``prepare_store`` answered ``None`` for a request, one line at most
  per such answer;
- "job N failed": the worker reported job N's copy as failed;
- "... for over N s" (a cache reset's flushed jobs overdue): N seconds of wall clock have
  passed since the first cache reset of the run;
- "NAME must be a non-negative int, got V": some request sent V as its NAME in its
  ``kv_transfer_params``, and V is not one (the machine sends only valid ones).

Lines of any other wording are not judged (a release's new warning is never a false alarm).
Checked with the ERROR lines (error_log.py), after every step's metadata and every update.
vLLM's once-a-process warnings are made once an engine, so each example sees its own. Known-bad
variants in faults.py: ``fence_warns_at_once`` (a reset's jobs overdue at once),
``success_warned_as_failure`` (every job done logged as failed).
"""

from __future__ import annotations

import ast
import logging
import re
import sys
import time
from typing import Any

from .checks import Checks
from .error_log import connector_logger

CANNOT_STORE = re.compile(r"cannot store")
JOB_FAILED = re.compile(r"\bjob (\d+) failed")
OVERDUE = re.compile(r"for over (\d+(?:\.\d+)?) ?s\b")
NOT_AN_INT = re.compile(r"(\w+) must be a non-negative int, got (.+?); ")


def _warnings_of(logger: logging.Logger) -> list[str]:
    """Every line ``logger.warning`` is asked to log, whatever the logger's level (kvgate runs
    vLLM's loggers at ERROR: a handler would see none), kept for the process (the logger
    outlives engines); what vLLM prints is left as it was."""
    lines = getattr(logger, "_kvgate_warnings", None)
    if lines is None:
        lines = []
        warning = logger.warning

        def recorded(msg, *args, **kwargs):
            try:
                lines.append(str(msg) % args if args else str(msg))
            except (TypeError, ValueError):
                lines.append(str(msg))
            return warning(msg, *args, **kwargs)

        logger.warning = recorded  # type: ignore[method-assign]
        logger._kvgate_warnings = lines  # type: ignore[attr-defined]
    return lines


class WarningClaims:
    """Watches the connector module's WARNING lines and checks what each one claims."""

    def __init__(self, engine: Any, checks: Checks):
        self.engine, self.checks = engine, checks
        logger = connector_logger(engine.connector)
        self.lines = _warnings_of(logger) if logger is not None else None
        self.seen = len(self.lines) if self.lines is not None else 0
        self.cannot_store = 0  # "cannot store" lines so far
        self.first_reset: float | None = None
        once = getattr(sys.modules.get("vllm.logger"), "_print_warning_once", None)
        clear = getattr(once, "cache_clear", None)
        if clear is not None:
            clear()
        conn = engine.connector
        reset_cache = conn.reset_cache

        def reset_cache_timed(*args, **kwargs):
            if self.first_reset is None:
                self.first_reset = time.monotonic()
            return reset_cache(*args, **kwargs)

        conn.reset_cache = reset_cache_timed

    def check(self, when: str) -> None:
        if self.lines is None:
            return
        new, self.seen = self.lines[self.seen :], len(self.lines)
        for line in new:
            why = self._false(line)
            if why:
                self.checks.fail(f"the connector warned {line!r} {when}, but {why}")

    def _false(self, line: str) -> str | None:
        if CANNOT_STORE.search(line):
            self.cannot_store += 1
            refused = self.checks.stats["allocation failures"]
            if self.cannot_store > refused:
                return f"prepare_store answered None {refused} time(s) in all, fewer than the lines"
        failed = JOB_FAILED.search(line)
        if failed and int(failed.group(1)) not in self.engine.worker.reported_failed:
            return f"the worker reported job {failed.group(1)} done, not failed"
        overdue = OVERDUE.search(line)
        if overdue:
            since = None if self.first_reset is None else time.monotonic() - self.first_reset
            if since is None or since < float(overdue.group(1)):
                return (
                    "there was no cache reset"
                    if since is None
                    else (f"the first cache reset was {since:.1f} s before")
                )
        value = NOT_AN_INT.search(line)
        if value:
            name = value.group(1)
            try:
                got = ast.literal_eval(value.group(2))
            except (ValueError, SyntaxError):
                return None
            if type(got) is int and got >= 0:
                return f"{got} is a non-negative int"
            sent = [p for p in self.engine.transfer_params.values() if name in p]
            if not any(p[name] == got for p in sent):
                return f"no request sent {name} {got!r}"
        return None
