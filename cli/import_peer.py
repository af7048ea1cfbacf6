"""The terminal side of `inferledger import --from TOOL`: run the peer import, print what joined."""
from __future__ import annotations

from pathlib import Path

import typer

from inferledger.cli.output import OutputFormat, command_name, echo_result


def import_peer_cmd(tool: str, path: Path, out: Path, *, server: Path | None, run_id: str | None, lenient: bool,
                    tool_version: str | None, fail, fmt: OutputFormat = OutputFormat.table) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from inferledger.collectors.peers.importer import OutDirError, PeerRecordsError, import_peer
    from inferledger.collectors.peers.join import ServerRunError
    from inferledger.collectors.peers.records import RecordError

    from inferledger.cli.progress import progress_bar

    try:
        with progress_bar(f"import {tool} output {path}" + (" and join it with the server's" if server else "")):
            res = import_peer(tool, path, out, server=server, lenient=lenient, run_id=run_id,
                              tool_version=tool_version)
    except PeerRecordsError as exc:
        for e in exc.errors:
            typer.echo(str(e), err=True)
        fail(f"{len(exc.errors)} record(s) of {path} refused; nothing was written. Fix them, or rerun with "
             "--lenient to import the rest and register these as gaps.")
    except RecordError as exc:  # the document itself is not the tool's output
        fail(f"inferledger import --from {tool}: {exc}")
    except (OutDirError, ServerRunError, FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        fail(f"inferledger import --from {tool}: {exc}")
    for r in res.refusals:
        typer.echo(f"warning: {r}", err=True)
    if res.refused:
        typer.echo(f"warning: {res.refused} refused record(s) went to the gap register ({out / 'gaps.parquet'})", err=True)
    if echo_result(fmt, res):
        return
    console = Console()
    console.print(f"imported {escape(tool)} {escape(res.version or '(version unknown)')} output {escape(str(path))} "
                  f"-> {escape(str(out))} (run [bold]{escape(res.run_id)}[/])", highlight=False)
    table = Table(show_header=True)
    cols = ["records", "events", "refused"] + (["joined", "unjoined", "server events"] if server else [])
    for c in cols:
        table.add_column(c, justify="right")
    table.add_row(*(str(getattr(res, c.replace(" ", "_"))) for c in cols))
    console.print(table)
    if server is not None:
        for rule, n in res.key_rules.items():
            console.print(f"  join by {escape(rule)}: {n}", highlight=False)
        m = res.mapping or {}
        if m.get("offset_ns") is not None:
            console.print(f"  clock {m['from_clock']} -> {m['to_clock']}: offset {m['offset_ns']:,} ns "
                          f"± {m['epsilon_ns']:,} ns (estimated from {m['n']} joined requests)", highlight=False)
        else:
            console.print(f"  [yellow]no clock mapping[/]: {escape(str(m.get('problem') or 'no request joined'))}")
    console.print(f"next: {command_name()} reconstruct {escape(str(out))}", highlight=False)
