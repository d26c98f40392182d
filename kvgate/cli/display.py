"""Where the commands print: progress on a terminal (rich), plain lines otherwise (CI, pipes)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence


class Display:
    """Lines, progress bars and tables; rich on a terminal, plain text otherwise."""

    def __init__(self, rich_progress: bool, stream=None):
        self.stream = stream or sys.stdout
        self.rich = rich_progress
        self._progress = None
        self._console = None
        if rich_progress:
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False)

    def __enter__(self):
        if self.rich:
            self._progress = live_progress(self._console, spinner=True)
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
            self._progress = None

    def _rich_console(self):
        return self._progress.console if self._progress is not None else self._console

    def line(self, text: str = "") -> None:
        console = self._rich_console()
        if console is not None:
            console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.stream, flush=True)

    def table(self, head: Sequence[str], body: Sequence[Sequence[str]]) -> None:
        console = self._rich_console()
        if console is not None:
            from rich.table import Table

            table = Table(*head)
            for row in body:
                table.add_row(*row)
            console.print(table)
            return
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        for row in [list(head)] + [list(r) for r in body]:
            self.line("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())

    def task(self, description: str, total: int) -> Callable[[], None] | None:
        """A progress bar of ``total`` ticks (``None`` without rich); call ``.done()`` at the
        end."""
        if self._progress is None:
            return None
        progress = self._progress
        task = progress.add_task(description, total=total)
        count = [0]

        def tick() -> None:
            count[0] += 1
            progress.update(
                task,
                completed=min(count[0], total),
                description=description if count[0] <= total else f"{description} (shrinking)",
            )

        def done():
            progress.remove_task(task)

        tick.done = done
        return tick


def live_progress(console, *, spinner: bool = False, remaining: bool = False):
    """A started rich progress display on ``console``, cleared when it ends: each task's
    description, bar, done/total and time elapsed, after a spinner and before the time
    remaining where asked."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns: list[ProgressColumn] = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    ]
    if spinner:
        columns.insert(0, SpinnerColumn())
    if remaining:
        columns.append(TimeRemainingColumn())
    progress = Progress(*columns, console=console, transient=True)
    progress.__enter__()
    return progress


def add_progress_flag(p: argparse.ArgumentParser, shows: str) -> None:
    """``--progress``/``--no-progress``, ``None`` when neither is given; ``shows``: the help,
    what it shows and when by default."""
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=shows)


def use_rich(flag: bool | None) -> bool:
    """``--progress``/``--no-progress``, else on a terminal and not under CI."""
    if flag is not None:
        return flag
    return sys.stdout.isatty() and not os.environ.get("CI")
