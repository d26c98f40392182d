"""A fuzzing campaign's find replayed by the next CI run (docs/fuzzing.md prints its output).

In a scratch copy of vLLM's test layout: a manager with a planted bug (impl's manager, except
that on a pool of 5 chunks with a threshold of 3 its skip metric counts every offer of a key)
and a gate file that checks it with 50 examples per run, as a quick CI gate would. Then:

1. the CI run (``CI=true pytest --kvgate-database DB``): the planted bug escapes its examples;
2. a HypoFuzz campaign over the same file and database (``hypothesis fuzz``), stopped after
   ``--seconds`` or when it has a failure for every test;
3. the CI run again: it replays the campaign's failure from the database and fails.

Run with an environment that has kvgate's ``fuzz`` extra (HypoFuzz)::

    python docs/campaign_demo.py --seconds 300
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLANTED = '''"""A planted bug: on a pool of 5 chunks with a threshold of 3, the skip metric
counts every offer of a key, not a request's first (kvgate's spec A5); elsewhere impl's."""

from kvgate.impl.manager import OffloadingManager
from kvgate.properties.catalogue.managers import SkipMetricEveryOffer


def planted(num_chunks, store_threshold=1, **kwargs):
    rare = num_chunks == 5 and store_threshold == 3
    cls = SkipMetricEveryOffer if rare else OffloadingManager
    return cls(num_chunks, store_threshold=store_threshold, **kwargs)
'''

GATE = """from kvgate.pytest_plugin import gate

test_planted = gate("planted:planted", machines="manager", max_examples=50)
"""

REPORT = """
import sys
from hypothesis.database import DirectoryBasedExampleDatabase
from hypofuzz.collection import collect_tests
from hypofuzz.database import HypofuzzDatabase
from hypofuzz.database.models import FailureState

db = HypofuzzDatabase(DirectoryBasedExampleDatabase(sys.argv[1]))
for target in collect_tests(["--kvgate-database", sys.argv[1], "tests"]).fuzz_targets:
    reports = sorted(db.reports.fetch(target.database_key), key=lambda r: r.elapsed_time)
    shrunk = list(db.failures(state=FailureState.SHRUNK).fetch(target.database_key))
    last = reports[-1]
    cases = {s.name.lower(): n for s, n in last.status_counts.items()}
    print(f"{target.nodeid}: {sum(cases.values())} test cases ({cases}) in "
          f"{last.elapsed_time:.1f} s of fuzzing; {len(shrunk)} shrunk failure(s) saved")
"""


def env(ci: bool) -> dict[str, str]:
    out = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "HYPOTHESIS_", "KVGATE_", "CI"))
    }
    if ci:
        out["CI"] = "true"
    return out


def ci_run(python: str, root: Path, db: Path) -> str:
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--kvgate-database", str(db)],
        cwd=root,
        env=env(ci=True),
        capture_output=True,
        text=True,
    )
    out = done.stdout + done.stderr
    run = re.search(r"^(PASS|FAIL) .*$", out, re.M)
    steps = re.search(r"^shrunk steps:\n((?:  .*\n)+)", out, re.M)
    return (
        f"exit {done.returncode} in {time.perf_counter() - start:.1f} s wall: "
        f"{run.group(0) if run else '?'}" + (f"\n{steps.group(1).rstrip()}" if steps else "")
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=int, default=300, help="the campaign's limit (wall)")
    p.add_argument("--python", default=sys.executable, help="a Python with kvgate[fuzz]")
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="kvgate-campaign-"))
    folder = root / "tests" / "v1" / "kv_offload"
    folder.mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")
    (root / "planted.py").write_text(PLANTED)
    (folder / "test_kvgate.py").write_text(GATE)
    db = root / "kvgate-db"
    print(f"scratch tree: {root}")
    print(f"1. CI run before the campaign: {ci_run(args.python, root, db)}")
    fuzz = Path(args.python).with_name("hypothesis")
    start = time.perf_counter()
    done = subprocess.run(
        ["timeout", str(args.seconds), str(fuzz), "fuzz", "-n", "1", "--no-dashboard", "--"]
        + ["--kvgate-database", str(db), "tests"],
        cwd=root,
        env=env(ci=False),
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    said = [ln for ln in (done.stdout + done.stderr).splitlines() if ln and ln[0] != " "]
    print(f"2. campaign: exit {done.returncode} after {wall:.0f} s wall ({'; '.join(said[:4])})")
    report = subprocess.run(
        [args.python, "-c", REPORT, str(db)],
        cwd=root,
        env=env(ci=False),
        capture_output=True,
        text=True,
    )
    print("   " + (report.stdout.strip() or report.stderr.strip()[-500:]))
    print(f"3. CI run after the campaign: {ci_run(args.python, root, db)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
