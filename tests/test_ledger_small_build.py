"""A small run's rebuild pays for no work it does not need: each SQL module parsed once per process, one
DuckDB thread where the run is one row group, and the write-ahead log of the temporary file never synced
(the final CHECKPOINT syncs the ledger before it is renamed into place). A reader's check of which code
built a ledger reads the modules' declarations, not every statement, and still sees an edited module."""
from __future__ import annotations

from inferledger.ledger import modules
from inferledger.ledger import reconstruct as build
from inferledger.ledger import stages
from inferledger.ledger.modules import ledger_modules
from inferledger.ledger.query import open_ledger
from ledger_util import build_run, event

EVENTS = [event("attempt.sent", 0, "1"), event("attempt.first_byte", 40, "1"), event("attempt.done", 90, "1")]


def test_each_sql_module_is_parsed_once_per_process(tmp_path):
    build_run(tmp_path / "a", EVENTS).close()
    sql = {m.sql for m in ledger_modules() if m.build is None}
    assert sql <= set(stages._PARSED)
    first = {text: stages._PARSED[text] for text in sql}
    prof: list = []
    build.reconstruct(tmp_path / "a", profile=prof)
    assert all(stages._PARSED[text] is parsed for text, parsed in first.items())  # not parsed again
    # the profile still times every statement of every SQL module, one row each
    n_statements = sum(len(first[m.sql]) for m in ledger_modules() if m.build is None)
    assert len([p for p in prof if p[0].endswith(".sql")]) == n_statements


class _Recording:
    """A connection that records the statements reconstruct runs on it besides the modules' own."""

    def __init__(self, con, log):
        self._con, self._log = con, log

    def execute(self, query, *args):
        if isinstance(query, str):
            self._log.append(query)
        return self._con.execute(query, *args)

    def __getattr__(self, name):
        return getattr(self._con, name)


def _settings(tmp_path, monkeypatch, name, small_bytes=None):
    log: list[str] = []
    connect = build.duckdb.connect
    monkeypatch.setattr(build.duckdb, "connect", lambda path, *a, **k: _Recording(connect(path, *a, **k), log))
    if small_bytes is not None:
        monkeypatch.setattr(build, "SMALL_RUN_BYTES", small_bytes)
    build_run(tmp_path / name, EVENTS).close()
    return [q for q in log if q.startswith(("SET threads", "SET fsync", "CHECKPOINT", "SET VARIABLE run_id"))]


def test_a_small_run_builds_in_one_thread_and_syncs_only_its_checkpoint(tmp_path, monkeypatch):
    assert _settings(tmp_path, monkeypatch, "small") == [
        "SET threads = 1", "SET fsync_mode = 'NONE'", "SET VARIABLE run_id = ?::VARCHAR",
        "SET fsync_mode = 'STANDARD'", "CHECKPOINT"]
    # a run of more than one row group keeps DuckDB's threads
    assert _settings(tmp_path, monkeypatch, "large", small_bytes=0) == [
        "SET fsync_mode = 'NONE'", "SET VARIABLE run_id = ?::VARCHAR", "SET fsync_mode = 'STANDARD'", "CHECKPOINT"]


def test_an_edited_module_makes_a_ledger_it_did_not_build_stale(tmp_path, monkeypatch):
    copy = tmp_path / "modules"
    copy.mkdir()
    for name, text in modules._sql_texts():
        (copy / f"{name}.sql").write_text(text)
    # from the declarations alone, the same hash as from the checked modules in their derived order
    assert modules.declared_sha256(copy) == modules.modules_sha256() == modules.code_sha256(ledger_modules())
    (copy / "figures.sql").write_text((copy / "figures.sql").read_text() + "\n-- one more comment\n")
    edited = modules.declared_sha256(copy)
    assert edited != modules.modules_sha256()
    build_run(tmp_path / "r", EVENTS).close()
    with open_ledger(tmp_path / "r") as led:
        assert led.stale == []
    monkeypatch.setattr(modules, "modules_sha256", lambda: edited)  # a reader with the edited module
    with open_ledger(tmp_path / "r") as led:
        assert len(led.stale) == 1 and "built by other ledger code" in led.stale[0]
