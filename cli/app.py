"""The `inferledger` command line (typer)."""
from __future__ import annotations

import inspect
import os
import re

# Before torch loads: OpenMP threads that spin while idle steal the 2nd core from the HTTP server's
# and the load client's event loops (measured 15x slower decode under contention).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


import typer

from inferledger.cli import (cmd_capture, cmd_data, cmd_demo, cmd_doctor, cmd_export, cmd_fit, cmd_ledger,  # noqa: E402
                             cmd_predict, cmd_report, cmd_serve, cmd_study, cmd_summary, cmd_whatif)

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},  # every command inherits -h
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"inferledger {version('inferledger')}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Rebuild every request of an LLM serving run from its events: intervals, the four accounts,
    TTFT / ITL / TPOT per observation layer, goodput, with evidence for every figure.

    Typical use: [bold]import[/] or capture a run, [bold]reconstruct[/] its ledger, then [bold]query[/] it with SQL.
    """


# Each command module owns its commands and registers them here. Importing them is cheap: heavy
# libraries (torch, duckdb, pyarrow) are imported inside the commands.
for _module in (cmd_data, cmd_ledger, cmd_serve, cmd_capture, cmd_predict, cmd_demo, cmd_whatif, cmd_report, cmd_export,
                cmd_doctor, cmd_summary, cmd_study, cmd_fit):
    _module.register(app)


_KEPT_LINE = re.compile(r"\s|Examples?\b|[-*•] |\d+[.)] ")  # an indented, example or list line starts anew


def reflowed(doc: str) -> str:
    """A help docstring whose paragraphs reflow to the terminal's width: a single line break inside a
    paragraph becomes a space (typer's rich mode keeps it, and rich then wraps each source line on its
    own, leaving short stubs), except before an indented, `Example...` or list line; a paragraph that
    starts with a `\\b` line is kept line for line (the `\\b` line dropped)."""
    paragraphs = []
    for para in re.split(r"\n[ \t]*\n", inspect.cleandoc(doc)):
        lines = para.split("\n")
        if lines[0].strip() == "\b":
            paragraphs.append("\n".join(lines[1:]))
            continue
        joined = lines[:1]
        for line in lines[1:]:
            if _KEPT_LINE.match(line):
                joined.append(line)
            else:
                joined[-1] += " " + line
        paragraphs.append("\n".join(joined))
    return "\n\n".join(paragraphs)


for _info in (*app.registered_commands, app.registered_callback):
    _info.help = reflowed(_info.help or inspect.getdoc(_info.callback) or "")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
