"""How fast the trace replay runs, and what the lockstep check costs, measured in one run.

    python bench/replay_speed.py [TRACE] [--check-limit N]

Prints the whole trace's replay on impl (no check) in requests and steps per second, and, on
the trace's first N requests, the replay with and without ``--check`` and their ratio.
Nothing is asserted: timings belong here, not in tests.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvgate.impl.traces import load_trace
from kvgate.replay import ReplaySettings, replay

DEFAULT_TRACE = Path(__file__).resolve().parents[1] / "data/mooncake/conversation_trace.jsonl"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    p.add_argument("--check-limit", type=int, default=2000)
    args = p.parse_args()
    trace = load_trace(args.trace)
    settings = ReplaySettings()

    t = time.perf_counter()
    whole = replay(trace, "impl", settings)
    whole_s = time.perf_counter() - t
    print(
        f"whole trace: {whole.requests:,} requests, {whole.steps:,} steps in {whole_s:.1f} s "
        f"({whole.requests / whole_s:,.0f} requests/s, {whole.steps / whole_s:,.0f} steps/s)"
    )

    head = trace[: args.check_limit]
    t = time.perf_counter()
    replay(head, "impl", settings)
    plain_s = time.perf_counter() - t
    t = time.perf_counter()
    checked = replay(head, "impl", settings, check=True)
    checked_s = time.perf_counter() - t
    print(
        f"first {len(head):,} requests: {plain_s:.1f} s plain, {checked_s:.1f} s with --check "
        f"(x{checked_s / plain_s:.1f}); divergence: {checked.divergence or 'none'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
