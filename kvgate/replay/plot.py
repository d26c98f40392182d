"""A replay sweep drawn with matplotlib (the ``plot`` extra): hit rate and cold admissions
against tier size."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvgate.outputs import write_with

from .engine import ReplayReport


class PlotUnavailable(Exception):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise ``PlotUnavailable`` (one line saying what to install) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401 - imported to learn whether it is installed
    except ImportError:
        raise PlotUnavailable(
            "matplotlib is not installed; install the plot extra: pip install 'kvgate[plot]'"
        ) from None


def plot_sweep(reports: Sequence[ReplayReport], path: str | Path, title: str = "") -> Path:
    """Hit rate and cold admissions against tier size, one line per (target, threshold):
    colour for the threshold, line style and marker for the target."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator

    series: dict[tuple[str, int], list[ReplayReport]] = {}
    for r in reports:
        series.setdefault((r.target, r.settings.store_threshold), []).append(r)
    targets = list(dict.fromkeys(r.target for r in reports))
    styles = [("-", "o", 7), ("--", "x", 9), (":", "s", 6), ("-.", "^", 6)]
    sizes = sorted({r.settings.num_chunks for r in reports})
    fig, (ax_hit, ax_cold) = plt.subplots(1, 2, figsize=(11, 4.4))
    for (target, threshold), rs in sorted(
        series.items(), key=lambda kv: (targets.index(kv[0][0]), kv[0][1])
    ):
        rs = sorted(rs, key=lambda r: r.settings.num_chunks)
        xs = [r.settings.num_chunks for r in rs]
        line, marker, size = styles[targets.index(target) % len(styles)]
        style = dict(
            linestyle=line,
            marker=marker,
            markersize=size,
            color=f"C{threshold}",
            label=f"{target}, T={threshold}",
            alpha=0.85,
        )
        ax_hit.plot(xs, [r.hit_rate for r in rs], **style)
        ax_cold.plot(xs, [r.cold_admissions for r in rs], **style)
    top = max([r.cold_admissions for r in reports] + [1])
    ax_cold.set_ylim(-0.04 * top, 1.12 * top)
    for ax, label in ((ax_hit, "CPU-tier prefix hit rate"), (ax_cold, "cold admissions (chunks)")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(n) for n in sizes])
        ax.set_xlabel("CPU tier size (chunks)")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    ax_cold.set_title("admitted while fewer than T distinct requests had offered them", fontsize=8)
    ax_hit.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    suffix = Path(path).suffix.lstrip(".") or "png"
    write_with(
        path, lambda out: fig.savefig(out, dpi=120, format=suffix), binary=True, flag="--plot"
    )
    plt.close(fig)
    return path
