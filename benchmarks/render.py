"""Writes the tables of docs/BENCHMARKS.md from the results files under benchmarks/results/.

A table sits between two markers in the doc, `<!-- rendered: ID -->` and `<!-- end rendered: ID -->`;
everything outside them is hand-written prose and stays as it is. ID names an entry of
render_tables.TABLES: the benchmark it draws on and which runs qualify (by their parameters). Each
table is drawn from the newest qualifying results file (a history table from all of them), under a
line that says which file, when, on what CPU and how loaded the machine was.

    .venv/bin/python benchmarks/render.py           # rewrite docs/BENCHMARKS.md
    .venv/bin/python benchmarks/render.py --check   # exit 1 if it is not current with the results
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from render_tables import TABLES, cpu_label, fmt, load_span, native_bf16  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "BENCHMARKS.md"
RESULTS = ROOT / "benchmarks" / "results"
BLOCK = re.compile(r"<!-- rendered: (?P<id>[\w.]+) -->\n(?P<body>.*?)<!-- end rendered: (?P=id) -->\n", re.S)
OPENING = re.compile(r"<!-- (end )?rendered: ?(?P<id>[^ ]*) -->")


class RenderError(Exception):
    """The doc or the results cannot be rendered: the message names the file and what to do."""


def load_results(folder: Path = RESULTS) -> list[dict]:
    """Every results file, each with its name under "_file", oldest first (date, then name)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            doc["_file"] = path.name
            doc["benchmark"], doc["date_utc"], doc["figures"]  # noqa: B018  (present, or refused below)
        except (ValueError, KeyError, TypeError) as exc:
            raise RenderError(f"{path}: not a results file ({exc!r})") from None
        out.append(doc)
    return sorted(out, key=lambda d: (d["date_utc"], d["_file"]))


def source_line(rs: list[dict]) -> str:
    """Which results file(s) a table comes from, and the machine as it was."""
    r = rs[-1]
    host, git = r.get("host") or {}, r.get("git") or {}
    commit = f"`{git['commit'][:7]}`{' (tree dirty)' if git.get('dirty') else ''}" if git.get("commit") else "no commit"
    busy = ", ".join(f"{b['name']} ×{b['processes']} {b['cpu_pct']:.0f} %" for b in
                     ((r.get("busy_processes") or {}).get("start") or []))
    files = (f"`benchmarks/results/{r['_file']}`" if len(rs) == 1 else
             f"{len(rs)} results files of `{r['benchmark']}`, the newest `benchmarks/results/{r['_file']}`")
    return (f"*From {files}: {r['date_utc'][:16].replace('T', ' ')} UTC, commit {commit}; {cpu_label(r)}, "
            f"{host.get('cpus_usable') or host.get('cores')} CPUs, torch ISA {host.get('torch_isa') or '?'}, "
            f"dtype auto → {host.get('dtype_auto') or '?'}; load (1 min) {load_span(r)}"
            f"{'; other processes busy at the start: ' + busy if busy else ''}; "
            f"{''.join(f'{k}={v} ' for k, v in (r.get('environment') or {}).items())}"
            f"`{r['command']}`; {fmt(r.get('wall_s'), '.0f')} s.*")


def render_table(table_id: str, results: list[dict], *, after: str | None = None) -> str:
    """One table under its source line; `after`: the results file of the table just above it in the
    doc, which the source line then only names."""
    rs = qualifying(table_id, results)
    spec = TABLES[table_id]
    try:
        body = spec.render(rs)
    except (KeyError, TypeError, ValueError) as exc:
        raise RenderError(f"table {table_id!r}: benchmarks/results/{rs[-1]['_file']} lacks a figure ({exc!r})") from None
    head = f"*Same run: `benchmarks/results/{rs[-1]['_file']}`.*" if after == rs[-1]["_file"] and len(rs) == 1 \
        else source_line(rs)
    return f"{head}\n\n{body}\n"


def render_doc(text: str, results: list[dict], *, doc_name: str = "docs/BENCHMARKS.md") -> str:
    """The doc with every marked table redrawn; a marker that does not pair up is refused by line."""
    paired = set()
    for m in BLOCK.finditer(text):
        paired |= {m.start(), m.end() - len(f"<!-- end rendered: {m['id']} -->\n")}
    for m in OPENING.finditer(text):
        if m.start() not in paired:
            line = text.count("\n", 0, m.start()) + 1
            raise RenderError(f"{doc_name}:{line}: marker {m.group(0)!r} has no partner (a table is "
                              f"'<!-- rendered: ID -->' ... '<!-- end rendered: ID -->', each on a line of its own)")
    out, last, previous = [], 0, None
    for m in BLOCK.finditer(text):
        if re.search(r"^## ", text[last:m.start()], re.M):
            previous = None  # a new section names its source in full
        table = render_table(m["id"], results, after=previous)
        previous = qualifying(m["id"], results)[-1]["_file"]
        out += [text[last:m.start()], f"<!-- rendered: {m['id']} -->\n{table}<!-- end rendered: {m['id']} -->\n"]
        last = m.end()
    return "".join(out + [text[last:]])


def qualifying(table_id: str, results: list[dict]) -> list[dict]:
    """The results files a table may draw on, oldest first; at least one, or RenderError."""
    if table_id not in TABLES:
        raise RenderError(f"no table {table_id!r} in benchmarks/render_tables.py (known: {', '.join(TABLES)})")
    spec = TABLES[table_id]
    rs = [r for r in results if r["benchmark"] == spec.benchmark and spec.select(r.get("parameters") or {})
          and spec.isa_held == bool((r.get("environment") or {}).get("ONEDNN_MAX_CPU_ISA"))
          and (spec.native_bf16 is None or spec.native_bf16 == native_bf16(r))]
    if not rs:
        raise RenderError(f"table {table_id!r}: no results file of {spec.benchmark} qualifies in "
                          f"benchmarks/results/; run benchmarks/{spec.benchmark}.py (see its marker's section)")
    return rs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when the doc is not current")
    ap.add_argument("--doc", type=Path, default=DOC)
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    try:
        text = a.doc.read_text()
        new = render_doc(text, load_results(a.results), doc_name=str(a.doc))
    except (RenderError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.check:
        if new != text:
            print(f"{a.doc} is not current with {a.results}: run python benchmarks/render.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        a.doc.write_text(new)
    print(f"{a.doc}: {len(BLOCK.findall(new))} tables rendered from {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
