"""What a campaign's example database holds for each item HypoFuzz would fuzz: its saved failures
and the test cases fuzzed since a moment, read through HypoFuzz's own collection and database
API (``kvgate fuzz`` runs this in a child process before and after its campaign, in the
campaign's environment; ``python -m kvgate.cli.fuzz_survey SINCE PYTEST_ARGS...`` prints one
JSON object).

HypoFuzz is imported by name (``importlib``), not statically: it is an optional tool, absent
from the environment CI lints in.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import sys
from typing import Any


def _reason(info: dict[str, Any]) -> str:
    """HypoFuzz's reason for leaving an item out, as words (``sets_derandomize``: the item's
    profile is derandomized, ``ci``; ``skip``: a skipped item, with pytest's reason)."""
    why = str(info.get("status_reason", "?"))
    extra = info.get("reason")
    if why == "error":
        tail = [ln for ln in str(info.get("traceback", "")).splitlines() if ln.strip()]
        extra = tail[-1].strip() if tail else None
    return f"{why}: {extra}" if extra else why


def _cases(reports: list[Any], since: float) -> tuple[int, float]:
    """Test cases and seconds of fuzzing since ``since``: each worker's reports count up, so
    its latest report holds its totals; the workers add up."""
    latest: dict[str, Any] = {}
    for r in reports:
        if r.timestamp >= since and (
            r.worker_uuid not in latest or r.elapsed_time >= latest[r.worker_uuid].elapsed_time
        ):
            latest[r.worker_uuid] = r
    cases = sum(sum(r.status_counts.values()) for r in latest.values())
    return cases, sum(r.elapsed_time for r in latest.values())


def survey(pytest_args: list[str], since: float) -> dict[str, Any]:
    """``{"items": [{"nodeid", "failures", "unshrunk", "cases", "seconds"}, ...], "left_out":
    {nodeid: reason}}``, or ``{"error": line}`` when pytest cannot collect. ``failures`` are the
    shrunk failures (the database's primary entries for the item, which a gate run replays
    first, whoever saved them), ``unshrunk`` those HypoFuzz found and has not shrunk yet (a
    gate run replays them too, after the primary ones); each is a digest of its choices."""
    collection = importlib.import_module("hypofuzz.collection")
    hdb = importlib.import_module("hypofuzz.database")
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        try:
            found = collection.collect_tests(pytest_args)
        except SystemExit:  # HypoFuzz exits on a collection error, after printing pytest's
            lines = [ln.strip() for ln in said.getvalue().splitlines() if ln.strip()]
            errors = [ln for ln in lines if ln.startswith(("E ", "ERROR", "Exiting"))]
            return {"error": (errors or lines or ["pytest collected nothing"])[0]}
    from hypothesis import settings

    db = hdb.HypofuzzDatabase(settings().database)
    items = []
    for target in found.fuzz_targets:
        key = target.database_key
        digests = {
            name: sorted(
                hashlib.sha1(repr(choices).encode()).hexdigest()
                for choices in db.failures(state=state).fetch(key)
            )
            for name, state in (
                ("failures", hdb.FailureState.SHRUNK),
                ("unshrunk", hdb.FailureState.UNSHRUNK),
            )
        }
        cases, seconds = _cases(list(db.reports.fetch(key)), since)
        items.append({"nodeid": target.nodeid, **digests, "cases": cases, "seconds": seconds})
    left_out = {nodeid: _reason(info) for nodeid, info in found.not_collected.items()}
    return {"items": items, "left_out": left_out}


def main(argv: list[str]) -> int:
    since, *pytest_args = argv
    print(json.dumps(survey(pytest_args, float(since))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
