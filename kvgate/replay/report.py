"""A replay's report as text: one run's figures, a comparison table (text or Markdown), JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .engine import ReplayReport, ReplaySettings

COLUMNS = (
    ("target", "target"),
    ("policy", "policy"),
    ("T", "store_threshold"),
    ("chunks", "num_chunks"),
    ("requests", "requests"),
    ("offers", "offers"),
    ("admitted", "admitted"),
    ("cold", "cold_admissions"),
    ("skips", "skips"),
    ("alloc fail", "allocation_failures"),
    ("preempt", "preemptions"),
    ("evictions", "evictions"),
    ("hit rate", "hit_rate"),
    ("s", "seconds"),
)


def _cell(report: ReplayReport, attr: str) -> str:
    if attr in ("store_threshold", "num_chunks"):
        return str(getattr(report.settings, attr))
    if attr == "policy":
        return report.policy
    value = getattr(report, attr)
    if attr == "hit_rate":
        return f"{value:.4f}"
    if attr == "seconds":
        return f"{value:.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table_rows(reports: Sequence[ReplayReport]) -> list[list[str]]:
    rows = []
    for r in reports:
        row = [_cell(r, attr) for _, attr in COLUMNS]
        if r.checked:
            row[0] += " (checked" + (", DIVERGED)" if r.divergence else ")")
        rows.append(row)
    return rows


def format_table(reports: Sequence[ReplayReport], fmt: str = "text") -> str:
    head = [name for name, _ in COLUMNS]
    rows = table_rows(reports)
    if fmt == "md":
        out = [
            "| " + " | ".join(head) + " |",
            "|" + "|".join("---" if i < 2 else "---:" for i in range(len(head))) + "|",
        ]
        out += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(out)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in rows])


def format_report(r: ReplayReport) -> str:
    s = r.settings
    lines = [
        f"target {r.target} ({r.policy}), tier {s.num_chunks} chunks of {s.blocks_per_chunk} "
        f"block(s) of {s.block_size} tokens, store_threshold {s.store_threshold}, "
        f"tracker {s.max_tracker_size}"
        + (", through vLLM's own scheduler" if getattr(s, "scheduler", "kvgate") == "vllm" else ""),
        f"  requests            {r.requests:,} ({r.finished:,} finished, {r.steps:,} steps, "
        f"{r.seconds:.1f} s)",
        f"  offers              {r.offers:,} ({r.retries:,} retries after None, "
        f"{r.finish_retries:,} at finish)",
        f"  admissions          {r.admitted:,} = {r.stores_completed:,} completed + "
        f"{r.stores_failed:,} failed + {r.stores_stale:,} dropped by resets + "
        f"{r.stores_in_flight:,} in flight",
        f"  cold admissions     {r.cold_admissions:,}",
        f"  skips               {r.skips:,}",
        f"  allocation failures {r.allocation_failures:,}",
        f"  preemptions         {r.preemptions:,}",
        f"  evictions           {r.evictions:,}",
        f"  resets              {r.resets:,}",
        f"  prefix hit rate     {r.hit_rate:.4f} ({r.prefix_hits:,} of {r.prefix_chunks:,} "
        f"chunks; {r.loads:,} loaded)",
    ]
    if r.checked:
        lines.append(
            "  lockstep check      "
            + ("DIVERGED" if r.divergence else "every manager call agreed with the model")
        )
    if r.data_errors is not None:
        lines.append(
            f"  data                {r.data_errors} error(s)"
            + (
                ""
                if r.data_errors
                else ": every load brought its blocks, every stored chunk holds its key's blocks"
            )
        )
        lines += [f"  data error: {e}" for e in r.data_error_examples]
    if r.divergence:
        lines.append(r.divergence)
    for example in r.cold_examples:
        lines.append(f"  cold: {example}")
    return "\n".join(lines)


def reports_json(reports: Sequence[ReplayReport]) -> str:
    """Every run's figures as JSON (what ``--json`` writes and ``reports_from_json`` reads)."""
    return json.dumps([r.as_dict() for r in reports], indent=1)


def reports_from_json(path: str | Path) -> list[ReplayReport]:
    """The reports a ``--json`` file holds (to redraw a table or plot without replaying)."""
    out = []
    for d in json.loads(Path(path).read_text()):
        d = dict(d)
        d["settings"] = ReplaySettings(**d["settings"])
        out.append(ReplayReport(**d))
    return out
