"""Trace replay (``kvgate replay``): the engine (``engine``), its report as tables and JSON
(``report``) and its plot (``plot``); the command line is ``command``."""

from .command import add_arguments, add_replay_parser, main_replay, run_replay
from .engine import ReplayReport, ReplaySettings, ReplayTargetError, make_worker, replay, resolve
from .plot import PlotUnavailable, plot_sweep, require_matplotlib
from .report import (
    COLUMNS,
    format_report,
    format_table,
    reports_from_json,
    reports_json,
    table_rows,
)

__all__ = [
    "COLUMNS",
    "add_arguments",
    "add_replay_parser",
    "main_replay",
    "run_replay",
    "PlotUnavailable",
    "ReplayReport",
    "ReplaySettings",
    "ReplayTargetError",
    "format_report",
    "format_table",
    "make_worker",
    "plot_sweep",
    "replay",
    "reports_from_json",
    "reports_json",
    "require_matplotlib",
    "resolve",
    "table_rows",
]
