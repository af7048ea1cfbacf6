"""HTML building blocks for the report: escaping, JSON for <script> blocks, tables, the page shell.

Every string that came from a run (ids, attrs, gap text, manifest values) goes through `esc` before it
is written as HTML, or travels as JSON (with `<`, `>`, `&` written as \\u escapes, so `</script>`
cannot end the block) and reaches the page through textContent.
"""
from __future__ import annotations

import html
import json
import math

from inferledger.report.assets import CSP, CSS, ERROR_HOOK_JS, PAGE_JS


def esc(s) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def _default(o):
    if isinstance(o, float):
        return None
    if isinstance(o, (set, tuple)):
        return list(o)
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    return str(o)


def _finite(o):
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def script_json(obj) -> str:
    """JSON that is safe inside <script type="application/json">: no `<`, `>`, `&`, U+2028/9 literally."""
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_default)
    except ValueError:
        text = json.dumps(_finite(obj), separators=(",", ":"), allow_nan=False, default=_default)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def fmt(v, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}" if abs(v) >= 10 ** -digits or v == 0 else f"{v:.3g}"
    return str(v)


def table(cols, rows, *, cls: str = "grid", numeric_digits: int = 3, caption: str | None = None) -> str:
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = "".join(f'<td class="num">{esc(fmt(v, numeric_digits))}</td>' if isinstance(v, (int, float))
                        and not isinstance(v, bool) else f"<td>{esc(fmt(v))}</td>" for v in r)
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f'<table class="{cls}">{cap}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def flatten(d, prefix: str = "", depth: int = 3) -> list[tuple[str, object]]:
    """Nested dicts as dotted keys (lists and deeper dicts shown as compact JSON)."""
    out = []
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and depth > 1 and v:
            out += flatten(v, key + ".", depth - 1)
        elif isinstance(v, (dict, list)):
            out.append((key, json.dumps(v, sort_keys=True, default=str)))
        else:
            out.append((key, v))
    return out


def kv_table(pairs, cls: str = "kv", max_value_chars: int = 400) -> str:
    rows = []
    for k, v in pairs:
        text = fmt(v, 3) if not isinstance(v, str) else v
        if len(text) > max_value_chars:
            text = text[:max_value_chars] + " …"
        rows.append(f"<tr><th>{esc(k)}</th><td>{esc(text)}</td></tr>")
    return f'<table class="{cls}"><tbody>{"".join(rows)}</tbody></table>'


def note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{esc(text)}</p>'


def section(sid: str, title: str, body: str, source: str | None = None) -> str:
    src = f'<p class="source">from {esc(source)}</p>' if source else ""
    return f'<section id="{esc(sid)}"><h2>{esc(title)}</h2>{src}{body}</section>'


class Page:
    """Collects sections, plotly figures (drawn by the page script) and JSON data for the scripts."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.figures: dict[str, dict] = {}
        self.data: dict[str, dict] = {"accounts": {}, "drill": {}, "gantt": {}, "timeline": {}}
        self.nav: list[tuple[str, str]] = []

    def figure(self, div_id: str, fig: dict, cls: str = "plot") -> str:
        self.figures[div_id] = fig
        return f'<div class="{cls}" id="{esc(div_id)}"></div>'

    def render(self, body: str, plotly_js: str) -> str:
        nav = "".join(f'<a href="#{esc(sid)}">{esc(label)}</a>' for sid, label in self.nav)
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(self.title)}</title><style>{CSS}</style>"
            f"<script>{ERROR_HOOK_JS}</script>"
            f"<script>{plotly_js}</script></head><body>"
            '<div id="report-errors" class="errors" hidden><b>Parts of this report failed to draw:</b><ul></ul></div>'
            f"<header><h1>{esc(self.title)}</h1><nav>{nav}</nav></header><main>{body}</main>"
            f'<script type="application/json" id="report-figures">{script_json(self.figures)}</script>'
            f'<script type="application/json" id="report-data">{script_json(self.data)}</script>'
            f"<script>{PAGE_JS}</script></body></html>\n")
