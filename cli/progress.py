"""Progress of long work on the terminal: one bar helper every command shares (capture, study,
reconstruct, repartition, report).

A bar is drawn on stderr, and only when stderr is a terminal: what a command prints on stdout (its
tables, `--format json|csv`) is the same bytes with a bar or without one, and a log or a pipe gets
no bar at all. Lines a command says while its bar is up (`Bar.say`) go above the bar on the
terminal; without a bar they go to stdout as before.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console

err_console = Console(stderr=True)


def stderr_is_terminal() -> bool:
    """A real terminal on stderr (FORCE_COLOR and the like do not make a log file one)."""
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # replaced or closed
        return False


class Bar:
    """One rich Progress on stderr (`progress`, None without a terminal) and its one task."""

    def __init__(self, progress, task) -> None:
        self.progress, self.task = progress, task

    @property
    def shown(self) -> bool:
        return self.progress is not None

    def update(self, description: str | None = None, *, completed: float | None = None,
               total: float | None = None) -> None:
        if self.progress is not None:
            self.progress.update(self.task, description=description, completed=completed, total=total)

    def advance(self, n: float = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)

    def finish(self, description: str) -> None:
        """The work done: the bar at its total (the last step counted, not only started) under `description`."""
        if self.progress is not None:
            total = self.progress.tasks[0].total if self.progress.tasks else None
            self.progress.update(self.task, description=description, completed=total)

    def restart(self, description: str, total: float | None) -> None:
        """The same bar counted again from 0 (and its clock from now)."""
        if self.progress is not None:
            self.progress.reset(self.task, total=total, description=description)

    def stop(self) -> None:
        """The bar off the terminal's live line now (before an error is printed)."""
        if self.progress is not None:
            self.progress.stop()

    def say(self, text: str) -> None:
        """A line for people: above the bar when there is one, else on stdout."""
        from inferledger.cli.output import console, show

        if self.progress is not None:
            self.progress.console.print(text, highlight=False)
        else:
            show(console, text)  # piped: one line, unwrapped


@contextmanager
def progress_bar(description: str, total: float | None = None, *, transient: bool = True) -> Iterator[Bar]:
    """A bar for the work inside the block (`total` None: a spinner and the elapsed time, for work of
    unknown length); `transient` takes it off the terminal at the end."""
    if not stderr_is_terminal():
        yield Bar(None, None)
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                               TimeElapsedColumn)

    with Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=transient, redirect_stdout=False,
                  redirect_stderr=False) as progress:
        yield Bar(progress, progress.add_task(description, total=total))
