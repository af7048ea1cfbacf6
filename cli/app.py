"""The `inferledger` command line (typer)."""
from __future__ import annotations

import os

# Before torch loads: OpenMP threads that spin while idle steal the 2nd core from the HTTP server's
# and the load client's event loops (measured 15x slower decode under contention).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


import typer
from rich.console import Console

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Rebuild every request of an LLM serving run from its events: intervals, the four accounts, "
    "TTFT / ITL / TPOT per observation layer, goodput, with evidence for every figure.\n\n"
    "Typical use: [bold]import[/] or capture a run, [bold]reconstruct[/] its ledger, then [bold]query[/] it with SQL.",
)
console = Console()
err = Console(stderr=True)


def _register_commands() -> None:
    # Each command module owns its commands and adds them here; importing them is cheap (heavy
    # libraries are imported inside the commands).
    import importlib

    for mod in ("cmd_data", "cmd_ledger", "cmd_serve", "cmd_capture", "cmd_demo", "cmd_whatif", "cmd_report",
                "cmd_export", "cmd_doctor", "cmd_summary"):
        try:
            module = importlib.import_module(f"inferledger.cli.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"inferledger.cli.{mod}":
                raise
            continue
        module.register(app)


_register_commands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
