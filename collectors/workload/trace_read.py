"""Reading the public traces users replay (Mooncake JSON Lines, BurstGPT CSV, Azure LLM-inference CSV)
into rows of trace time and token lengths, with the row window applied while reading.

Every row read is checked; a bad one is named by file:line and field (a missing column or key, a value
that is no number, negative, NaN, not whole, past its bound, or a timestamp earlier than the row
before), every one listed, and nothing is returned. Reading stops once the window is full, so rows after
it are neither read nor checked. It is bounded as it goes (docs/CAPTURE.md "Bounds"): at most
MAX_TRACE_ROWS_READ rows read, lines of at most MAX_TRACE_LINE_BYTES, MAX_TRACE_BLOCK_IDS block ids
kept, and with `max_sent` at most that many rows with an output in the window; past one, the file is
refused at that line, naming the bound. docs/CAPTURE.md "Real traces as workloads" says what each
field means.
"""
from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from pathlib import Path

from .read_lines import ReadLines
from .schema import MAX_TRACE_BLOCK_IDS, MAX_TRACE_LINE_BYTES, MAX_TRACE_ROWS_READ, MAX_TRACE_S, MAX_TRACE_TOKENS

MAX_LISTED = 50  # refusals listed in full; the rest are counted

# each format's (time, input, output) field names, as the file spells them
FIELDS = {"mooncake": ("timestamp", "input_length", "output_length"),
          "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
          "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens")}
CSV_COLUMNS = {"burstgpt": ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"),
               "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens")}
_DATETIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?")


@dataclass(frozen=True)
class TraceRow:
    line: int
    t_ns: int  # trace time: since the file's first row
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None  # Mooncake: the id of each block of the prompt
    model: str | None = None  # BurstGPT: the model that served the row


@dataclass
class TraceRead:
    path: Path
    format: str
    rows: list[TraceRow]  # the window, in file order
    rows_read: int  # rows of the file read to fill it (the window's and those before it)
    sha256: str  # of the bytes read: the file's first `sha256_bytes` bytes, through the last line read
    sha256_bytes: int
    file_bytes: int  # the file's size


class _Bad(ValueError):
    """One field of one row is wrong (its message is the problem)."""


def read_trace(path: Path, fmt: str, *, skip_rows: int = 0, max_rows: int | None = None, start_s: float = 0.0,
               end_s: float | None = None, max_sent: int | None = None) -> TraceRead:
    """The rows of `path` whose trace time lies in [start_s, end_s), less the first `skip_rows` of them, at
    most `max_rows`; a ValueError listing every bad row read (`<file>:<line>: <field>: <problem>`), or
    naming the line where reading passed a bound (`max_sent`: rows with an output in the window)."""
    start_ns, end_ns = _ns(start_s), (None if end_s is None else _ns(end_s))
    rows, problems, read, skipped, sent, block_ids = [], [], 0, 0, 0, 0
    n_problems = 0
    first = last = None  # (line, t_ns) of the first and the latest good row
    window = (f"[trace] skip_rows = {skip_rows}, start_s = {start_s}, end_s = {end_s}, max_rows = {max_rows}")
    lines = ReadLines(path, MAX_TRACE_LINE_BYTES, "one row of a trace")
    records = _records(lines, path, fmt)
    try:
        for line, rec in records:
            read += 1
            if read > MAX_TRACE_ROWS_READ:
                raise ValueError(f"{path}:{line}: {MAX_TRACE_ROWS_READ} rows read and the window ({window}) "
                                      f"is not complete: a trace is read for at most {MAX_TRACE_ROWS_READ} rows "
                                      f"(about 5 s); cut the rows to replay into a file of their own")
            row, bad = _row(fmt, line, rec)
            if bad:
                n_problems += len(bad)
                problems += [f"{path}:{line}: {field}: {why}" for field, why in bad][:MAX_LISTED - len(problems)]
                continue
            if last is not None and row.t_ns < last[1]:
                n_problems += 1
                if len(problems) < MAX_LISTED:
                    problems.append(f"{path}:{line}: {FIELDS[fmt][0]}: earlier than line {last[0]}'s; a trace's "
                                    f"rows must be in time order")
                continue
            first, last = first or (line, row.t_ns), (line, row.t_ns)
            t = row.t_ns - first[1]
            if t < start_ns:
                continue
            if end_ns is not None and t >= end_ns:
                break
            if skipped < skip_rows:
                skipped += 1
                continue
            sent += row.output_tokens > 0
            if max_sent is not None and sent > max_sent:
                raise ValueError(f"{path}:{line}: the window ({window}) holds more than {max_sent} rows with "
                                      f"an output: at most {max_sent} tasks in one workload; set [trace].max_rows "
                                      f"(at most {max_sent}) or a shorter window")
            block_ids += len(row.hash_ids or ())
            if block_ids > MAX_TRACE_BLOCK_IDS:
                raise ValueError(f"{path}:{line}: hash_ids: the window's rows hold more than "
                                      f"{MAX_TRACE_BLOCK_IDS} block ids together (allowed: at most "
                                      f"{MAX_TRACE_BLOCK_IDS}, the prompt tokens one workload builds)")
            rows.append(TraceRow(line, t, row.input_tokens, row.output_tokens, row.hash_ids, row.model))
            if max_rows is not None and len(rows) >= max_rows:
                break
    except UnicodeDecodeError as exc:  # (an OSError is the caller's: it names the workload's key)
        raise ValueError(f"{path}: cannot be read as a {fmt} trace ({exc})") from None
    except _Bad as exc:  # the file as a whole (its header), or one line of it, cannot be read
        raise ValueError(str(exc)) from None
    finally:
        records.close()
        lines.close()
    if problems:
        more = n_problems - len(problems)
        raise ValueError("\n".join(problems + ([f"{path}: … and {more} more bad rows"] if more > 0 else [])))
    if not rows:
        raise ValueError(f"{path}: no row in the window ([trace] skip_rows = {skip_rows}, start_s = {start_s}, "
                         f"end_s = {end_s}; {read} rows read)")
    return TraceRead(path, fmt, rows, read, lines.sha256(), lines.bytes_read, lines.size)


def _records(lines: ReadLines, path: Path, fmt: str):
    """(line number, record) of each non-blank row: a parsed JSON value, or a dict of CSV columns."""
    if fmt == "mooncake":
        for n, text in enumerate(lines, 1):
            if text.strip():
                try:
                    yield n, json.loads(text)
                except ValueError as exc:
                    yield n, _Bad(f"not JSON ({str(exc)[:200]})")
                except RecursionError:
                    yield n, _Bad("not JSON (nested too deeply)")
        return
    reader = csv.reader(iter(lines))
    try:
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in CSV_COLUMNS[fmt] if c not in header]
        if missing:
            raise _Bad(f"{path}:1: header: no column {', '.join(map(repr, missing))} for a {fmt} trace "
                       f"(columns: {', '.join(map(repr, header))[:400] or 'none'})")
        for values in reader:
            if any(v.strip() for v in values):
                yield reader.line_num, dict(zip(header, values))
    except csv.Error as exc:  # a field past the csv module's limit, a quote left open at the end
        why = ("its lines end in a bare carriage return: lines end in \\n or \\r\\n" if "new-line character" in str(exc)
               else str(exc))
        raise _Bad(f"{path}:{reader.line_num}: cannot be read as CSV ({why})") from None


def _row(fmt: str, line: int, rec) -> tuple[TraceRow | None, list[tuple[str, str]]]:
    """The row, or the (field, problem) pairs that keep it from being one."""
    if isinstance(rec, _Bad):
        return None, [("row", str(rec))]
    if fmt == "mooncake" and not isinstance(rec, dict):
        return None, [("row", f"must be a JSON object, not {json.dumps(rec)[:40]}")]
    t_field, in_field, out_field = FIELDS[fmt]
    parse_time = _datetime_ns if fmt == "azure" else (lambda v: _number_ns(v, 10**6 if fmt == "mooncake" else 10**9))
    fields = [(t_field, parse_time), (in_field, _count), (out_field, _count)]
    if fmt == "mooncake":  # JSON has types: a number written as a string is refused, as in the workload file
        fields = [(name, _json_number(parse)) for name, parse in fields]
    if fmt == "mooncake":
        fields.append(("hash_ids", _hash_ids))
    elif fmt == "burstgpt":
        fields += [("Model", _text), ("Total tokens", _count), ("Log Type", _text)]
    got, bad = {}, []
    for name, parse in fields:
        value = rec.get(name) if isinstance(rec, dict) else None
        if value is None or (isinstance(value, str) and not value.strip()):
            bad.append((name, "missing"))
            continue
        try:
            got[name] = parse(value)
        except _Bad as exc:
            bad.append((name, str(exc)))
    if bad:
        return None, bad
    return TraceRow(line, got[t_field], got[in_field], got[out_field], got.get("hash_ids"), got.get("Model")), []


def _json_number(parse):
    def parse_json(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Bad(f"must be a number, not {json.dumps(value)[:40]}")
        return parse(value)
    return parse_json


def _decimal(value) -> Decimal:
    """A JSON number or a CSV cell as an exact decimal; anything else refused by what it is."""
    try:
        d = Decimal(value.strip() if isinstance(value, str) else repr(value) if isinstance(value, float) else value)
    except InvalidOperation:
        raise _Bad(f"must be a number, not {_short(value)}") from None
    if not d.is_finite():
        raise _Bad(f"must be a finite number, not {_short(value)}")
    if d < 0:
        raise _Bad(f"must be >= 0, not {_short(value)}")
    return d


def _count(value) -> int:
    d = _decimal(value)
    if d > MAX_TRACE_TOKENS:  # (checked before int(): 1e999999999 would take forever to spell out)
        raise _Bad(f"must be <= {MAX_TRACE_TOKENS} tokens, not {_short(value)}")
    if d != d.to_integral_value():
        raise _Bad(f"must be a whole number of tokens, not {_short(value)}")
    return int(d)


def _number_ns(value, ns_per_unit: int) -> int:
    d, most = _decimal(value), Decimal(int(MAX_TRACE_S)) * 10**9 / ns_per_unit  # (compared before any product)
    if d > most:
        raise _Bad(f"must be <= {most:f} ({MAX_TRACE_S:g} s), not {_short(value)}")
    return int((d * ns_per_unit).to_integral_value())


def _short(value) -> str:
    """A value as a refusal quotes it: at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _text(value) -> str:
    return str(value).strip()


def _hash_ids(value) -> tuple[int, ...]:
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
        raise _Bad(f"must be a list of whole numbers >= 0, not {json.dumps(value)[:40]}")
    return tuple(value)


def _datetime_ns(value) -> int:
    """A datetime as the Azure traces write it ('2023-11-16 18:15:46.6805900', an optional zone) in ns
    since the Unix epoch, every digit of the fraction kept; no zone: UTC."""
    m = _DATETIME.fullmatch(str(value).strip())
    try:
        if not m:
            raise ValueError
        at = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}").replace(tzinfo=timezone.utc)
    except ValueError:
        raise _Bad(f"must be a datetime like '2023-11-16 18:15:46.6805900', not {_short(value)}") from None
    zone = m.group(4)
    if zone and zone != "Z":
        sign, hh, mm = zone[0], int(zone[1:3]), int(zone[-2:])
        at -= (1 if sign == "+" else -1) * timedelta(hours=hh, minutes=mm)
    whole = (at - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(seconds=1)
    return whole * 10**9 + int((m.group(3) or "0").ljust(9, "0"))


def _ns(seconds: float) -> int:
    return int((Decimal(repr(float(seconds))) * 10**9).to_integral_value())

