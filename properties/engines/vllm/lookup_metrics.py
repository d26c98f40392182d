"""The connector's lookup metrics, counted exactly (issue 30, item 4; spec §7.2).

The connector's scheduler side times its lookups and reports two histograms with its stats
(where the release has them):

- ``vllm:kv_offload_lookup_sync_delay_seconds``: one observation per lookup it runs (a call of
  ``get_num_new_matched_tokens`` for a request with no transfer in flight);
- ``vllm:kv_offload_lookup_async_delay_seconds``: one observation per deferral: from a lookup
  that answers ``None`` (the tier asked for time, or a chunk it would load is being loaded) to
  the request's next lookup that answers a number, or to its finish, whichever comes first.

The counts are judged exactly: at every ``get_stats`` (which hands over what was observed
since the last one) the observations reported so far equal the lookups and the closed
deferrals seen so far. The seconds are wall clock, so only bounded: the seconds a payload
reports are not negative and not more than its observations times the seconds the engine
has run (a delay measured from the wrong clock, or added where it is subtracted, is either).

Its planted fault (a connector that drops an observation) is in faults.py.
"""

from __future__ import annotations

import time
from typing import Any

from . import private_names as pn
from .checks import Checks

SYNC_DELAY = "vllm:kv_offload_lookup_sync_delay_seconds"
ASYNC_DELAY = "vllm:kv_offload_lookup_async_delay_seconds"


class LookupDelays:
    """Wraps the connector's scheduler side (instance attributes only) and counts."""

    def __init__(self, conn: Any, checks: Checks):
        self.conn = conn
        self.checks = checks
        self.want = {SYNC_DELAY: 0, ASYNC_DELAY: 0}
        self.got = {SYNC_DELAY: 0, ASYNC_DELAY: 0}
        self.deferred: set[str] = set()  # requests whose last lookup answered None
        self.started = time.monotonic()  # no delay observed in this engine can be longer
        if hasattr(conn, pn.OBSERVE_ASYNC_DELAY) and hasattr(conn, "get_stats"):
            self._wrap()

    def _wrap(self) -> None:
        conn = self.conn
        matched = conn.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request, *args, **kwargs):
            status = getattr(conn, pn.REQ_STATUS).get(request.request_id)
            runs = status is not None and not status.transfer_jobs
            got = matched(request, *args, **kwargs)
            if runs:
                self.lookup(request.request_id, got[0] if isinstance(got, tuple) else got)
            return got

        conn.get_num_new_matched_tokens = get_num_new_matched_tokens
        finished = conn.request_finished

        def request_finished(request, *args, **kwargs):
            if request.request_id in getattr(conn, pn.REQ_STATUS):
                self.close(request.request_id)
            return finished(request, *args, **kwargs)

        conn.request_finished = request_finished
        get_stats = conn.get_stats

        def get_stats_counted():
            stats = get_stats()
            reduce = getattr(stats, "reduce", None)
            if reduce is not None:
                counts: dict[str, int] = {}
                sums: dict[str, float] = {}
                for name, value in reduce().items():
                    for metric in self.got:
                        if name.startswith(metric) and name.endswith("_count"):
                            counts[metric] = counts.get(metric, 0) + int(value)
                        elif name.startswith(metric) and name.endswith("_sum"):
                            sums[metric] = sums.get(metric, 0.0) + float(value)
                for metric, n in counts.items():
                    self.got[metric] += n
                    self._bounded(metric, n, sums.get(metric, 0.0))
            self.check()
            return stats

        conn.get_stats = get_stats_counted

    def _bounded(self, metric: str, count: int, seconds: float) -> None:
        ran = time.monotonic() - self.started
        if not 0 <= seconds <= count * ran + 1e-6:
            self.checks.fail(
                f"the connector's {metric} histogram reports {seconds:.6g} s over {count} "
                f"observation(s); the engine has run {ran:.3g} s"
            )

    def lookup(self, req_id: str, hit: int | None) -> None:
        self.want[SYNC_DELAY] += 1
        if hit is None:
            self.deferred.add(req_id)
            self.checks.stats["deferred lookups timed"] += 1
        else:
            self.close(req_id)

    def close(self, req_id: str) -> None:
        if req_id in self.deferred:
            self.deferred.discard(req_id)
            self.want[ASYNC_DELAY] += 1

    def check(self) -> None:
        for metric, want in self.want.items():
            if self.got[metric] != want:
                what = "lookups run" if metric == SYNC_DELAY else "deferred lookups closed"
                self.checks.fail(
                    f"the connector's {metric} histogram holds {self.got[metric]} "
                    f"observation(s); there were {want} {what}"
                )
                return
