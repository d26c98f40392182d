"""``kvgate fuzz``: a HypoFuzz campaign over a suite's kvgate items, in the maintainer's own
environment, saving what it finds in the example database the CI gate reads, and ending with one
line: found or not, how many test cases, where they are saved (docs/fuzzing.md).

    kvgate fuzz [--minutes M] [-n N] [--database DIR|redis://...] [--profile dev|thorough]
                [--log FILE] [--dashboard] [--] [PYTEST_ARGS ...]

It wraps HypoFuzz's own command (``hypothesis fuzz``), run as a child process with what a
campaign needs: the database (``--database``, else ``$KVGATE_DATABASE``, else ``.kvgate-db``,
the folder the CI jobs of docs/adopt.md and docs/ci-gate.md name) given to the plugin as
``--kvgate-database``; a random profile (``dev``), because HypoFuzz leaves derandomized tests
out and Hypothesis derandomizes every profile where a CI variable is set, so the child runs
without them; and the hash seed the CI jobs set (``$PYTHONHASHSEED``, else 0), since vLLM's
scheduler iterates sets of request ids. HypoFuzz's own output (its exit status is 1 however it
ends, and its workers print tracebacks when torn down) goes to a log file; the verdict is read
from the database (``kvgate.cli.fuzz_survey``) before and after.

Exit 0: nothing failed; 1: the database holds a failure of a fuzzed item (new or found again);
2: a usage error, nothing to fuzz, or HypoFuzz ended on an error of its own (one line naming its
log).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvgate.argtypes import positive
from kvgate.gate.database import open_database
from kvgate.gate.errors import UsageError, one_line

# The example database the documented CI jobs name (docs/adopt.md step 4, docs/ci-gate.md).
DEFAULT_DATABASE = ".kvgate-db"
# The hash seed the documented CI jobs set.
HASH_SEED = "0"
# Profiles a campaign can run: random ones (HypoFuzz leaves derandomized tests out).
CAMPAIGN_PROFILES = ("dev", "thorough")
# What makes Hypothesis load its own derandomized ``ci`` profile, under every profile kvgate
# registers after it (Hypothesis 6.170: ``hypothesis._settings._CI_VARS``).
CI_VARIABLES = (
    "CI",
    "__TOX_ENVIRONMENT_VARIABLE_ORIGINAL_CI",
    "TF_BUILD",
    "bamboo.buildKey",
    "BUILDKITE",
    "CIRCLECI",
    "CIRRUS_CI",
    "CODEBUILD_BUILD_ID",
    "GITHUB_ACTIONS",
    "GITLAB_CI",
    "HEROKU_TEST_RUN_ID",
    "TEAMCITY_VERSION",
)
# What HypoFuzz prints when it stops itself: every item it fuzzed has a failure.
HYPOFUZZ_DONE = "Found a failing input for every test!"
# After SIGINT, how long HypoFuzz's processes get to stop before SIGTERM, then SIGKILL.
GRACE_S = 20.0
KVGATE_ROOT = Path(__file__).resolve().parents[2]


def minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "fuzz",
        help="a HypoFuzz campaign over a suite's kvgate items, saved where CI reads",
        description="Fuzz the kvgate items of a pytest suite with HypoFuzz and save what it "
        "finds in the example database the CI gate reads. Exit 0: nothing failed; 1: the "
        "database holds a failure of a fuzzed item; 2: a usage error or no campaign.",
    )
    p.add_argument(
        "--minutes",
        type=minutes,
        metavar="M",
        help="stop after M minutes (default: when every item has a failure, or on Ctrl-C)",
    )
    p.add_argument(
        "-n",
        "--processes",
        type=positive,
        default=1,
        metavar="N",
        help="HypoFuzz's worker processes (default 1)",
    )
    p.add_argument(
        "--database",
        metavar="DIR|redis://HOST:PORT",
        default=os.environ.get("KVGATE_DATABASE") or DEFAULT_DATABASE,
        help="the example database to save finds in: the one the CI gate names "
        f"(default: $KVGATE_DATABASE, else {DEFAULT_DATABASE}, the documented CI jobs' folder)",
    )
    p.add_argument(
        "--profile",
        choices=CAMPAIGN_PROFILES,
        default="dev",
        help="kvgate profile of the items (default dev; thorough: longer programs)",
    )
    p.add_argument(
        "--log",
        metavar="FILE",
        help="where HypoFuzz's own output goes (default: a file in the temporary folder)",
    )
    p.add_argument(
        "--dashboard", action="store_true", help="serve HypoFuzz's live dashboard (port 9999)"
    )
    p.add_argument(
        "pytest_args",
        nargs=argparse.REMAINDER,
        metavar="PYTEST_ARGS",
        help="what pytest collects (paths, -k ...; default: the suite's own test paths)",
    )
    p.set_defaults(func=cmd_fuzz)
    return p


def install_hint() -> str:
    pins = KVGATE_ROOT / "constraints.txt"
    where = f"-c {pins} " if pins.is_file() else ""
    return f"pip install {where}hypofuzz"


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CI_VARIABLES}
    env = {k: v for k, v in env.items() if not k.startswith(("HYPOTHESIS_", "PYTEST_"))}
    env["PYTHONHASHSEED"] = os.environ.get("PYTHONHASHSEED") or HASH_SEED
    return env


def pytest_args_of(args: argparse.Namespace) -> list[str]:
    user = list(args.pytest_args or [])
    if user[:1] == ["--"]:
        user = user[1:]
    for word in user:
        for flag, ours in (("--kvgate-database", "--database"), ("--kvgate-profile", "--profile")):
            if word == flag or word.startswith(flag + "="):
                raise UsageError(f"kvgate fuzz: {flag}: give it as kvgate fuzz {ours}")
    return ["--kvgate-database", args.database, "--kvgate-profile", args.profile, *user]


def run_survey(pytest_args: list[str], since: float, env: dict[str, str]) -> dict[str, Any]:
    code = [sys.executable, "-m", "kvgate.cli.fuzz_survey", repr(since), *pytest_args]
    done = subprocess.run(code, env=env, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        said = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        return {"error": f"collecting the items failed: {said[-1] if said else done.returncode}"}


def stop(proc: subprocess.Popen) -> None:
    """SIGINT to HypoFuzz's process group (its hub and workers), as Ctrl-C would; then harder."""
    for sig, wait in ((signal.SIGINT, GRACE_S), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def campaign(argv: list[str], env: dict[str, str], log: Path, limit_s: float | None) -> str:
    """Run HypoFuzz until it stops itself, ``limit_s`` passes or Ctrl-C: ``"done"``
    (every item failed), ``"stopped"`` (by time or Ctrl-C), or HypoFuzz's last line when it
    ended otherwise (an error of its own)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            stop(proc)
            return "stopped"
        except KeyboardInterrupt:
            stop(proc)
            return "stopped"
    text = log.read_text(errors="replace")
    if HYPOFUZZ_DONE in text:
        return "done"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {proc.returncode} with no output"


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}"


def hypofuzz_installed() -> bool:
    return importlib.util.find_spec("hypofuzz") is not None


def cmd_fuzz(args: argparse.Namespace) -> int:
    pytest_args = pytest_args_of(args)
    if not hypofuzz_installed():
        raise UsageError(
            f"kvgate fuzz: HypoFuzz is not installed in this environment ({sys.executable}); "
            f"add it without reinstalling kvgate: {install_hint()}"
        )
    open_database(args.database)  # a UsageError (one line) when it cannot be opened
    if args.log:
        log = Path(args.log)
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.touch()
        except OSError as exc:
            raise UsageError(f"kvgate fuzz: --log {args.log}: {exc.strerror}") from None
    else:
        fd, name = tempfile.mkstemp(prefix="kvgate-fuzz-", suffix=".log")
        os.close(fd)
        log = Path(name)
    env = child_env()
    started = time.time()
    before = run_survey(pytest_args, started, env)
    if "error" in before:
        raise UsageError(f"kvgate fuzz: {before['error']}")
    left_out = before["left_out"]
    if not before["items"]:
        why = "; ".join(f"{n} ({r})" for n, r in left_out.items()) or "no kvgate item collected"
        raise UsageError(f"kvgate fuzz: nothing to fuzz: {why}")
    names = [i["nodeid"] for i in before["items"]]
    print(
        f"kvgate fuzz: {plural(len(names), 'item')}, {plural(args.processes, 'process')}, "
        f"profile {args.profile}, PYTHONHASHSEED={env['PYTHONHASHSEED']}, database "
        f"{args.database}, "
        + (f"for {args.minutes:g} min" if args.minutes else "until each item fails or Ctrl-C")
        + f"; HypoFuzz's output: {log}",
        flush=True,
    )
    for nodeid, why in left_out.items():
        print(f"  not fuzzed: {nodeid} ({why})", flush=True)
    argv = [sys.executable, "-c", "import sys; from hypothesis.extra.cli import main; main()"]
    argv += ["fuzz", "-n", str(args.processes)]
    argv += ["--dashboard" if args.dashboard else "--no-dashboard", "--", *pytest_args]
    ended = campaign(argv, env, log, args.minutes * 60 if args.minutes else None)
    wall = time.time() - started
    after = run_survey(pytest_args, started, env)
    if "error" in after:
        raise UsageError(f"kvgate fuzz: after the campaign: {after['error']}")
    return summarize(before, after, args.database, wall, ended, log)


def summarize(
    before: dict[str, Any],
    after: dict[str, Any],
    database: str,
    wall: float,
    ended: str,
    log: Path,
) -> int:
    """One line per item, then the one-line summary; the exit code."""
    old = {i["nodeid"]: set(i["failures"]) | set(i["unshrunk"]) for i in before["items"]}
    items = [i for i in after["items"] if i["nodeid"] in old]
    cases = sum(i["cases"] for i in items)
    failing, new = [], 0
    for i in items:
        saved = set(i["failures"]) | set(i["unshrunk"])
        fresh = saved - old[i["nodeid"]]
        new += len(fresh)
        if i["failures"]:
            state = f"{plural(len(i['failures']), 'shrunk failure')} saved"
        elif i["unshrunk"]:
            state = f"{plural(len(i['unshrunk']), 'failure')} saved, not yet shrunk"
        else:
            state = "no failure"
        if saved:
            failing.append(i["nodeid"])
            state += f" ({len(fresh)} new)" if fresh else " (saved by an earlier run)"
        fuzzed = f"{plural(i['cases'], 'test case')} in {i['seconds']:.0f} s"
        print(f"  {i['nodeid']}: {fuzzed}, {state}")
    took = f"{wall / 60:.1f} min"
    if failing:
        print(
            f"kvgate fuzz: FOUND: {len(failing)} of {plural(len(items), 'item')} failed "
            f"({new} new) in "
            f"{plural(cases, 'test case')} ({took}); saved in {database}: a gate run naming "
            "it replays them first"
        )
        code = 1
    else:
        print(
            f"kvgate fuzz: nothing found: {plural(cases, 'test case')} over "
            f"{plural(len(items), 'item')} ({took}); the corpus is saved in {database}"
        )
        code = 0
    if ended not in ("done", "stopped"):
        print(
            f"kvgate fuzz: HypoFuzz ended on an error of its own: {one_line(ended)} (see {log})",
            file=sys.stderr,
        )
        return 2
    return code
