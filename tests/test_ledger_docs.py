"""Every public column of the ledger carries its doc comment in the SQL, and docs/LEDGER.md's table
reference is the one generated from those comments."""
from __future__ import annotations

import re
from pathlib import Path

from inferledger.ledger import docgen

LEDGER_MD = Path(__file__).resolve().parent.parent / "docs" / "LEDGER.md"


def test_every_public_column_is_documented_beside_its_definition(tmp_path):
    docs, shared = docgen.column_docs()
    con = docgen.sample_ledger(tmp_path / "run")
    try:
        columns = docgen.ledger_columns(con)
    finally:
        con.close()
    assert sum(len(c) for c in columns.values()) > 350
    assert docgen.undocumented(columns, docs, shared) == []


def test_a_column_without_a_comment_is_found():
    docs, shared = {}, {}
    docgen.parse("-- @table t: one row per thing\n-- @column a: the a\n--   and more\nSELECT 1;\n", "t.sql", docs, shared)
    assert docs["t"].columns == {"a": "the a and more"}
    columns = {"t": [("a", "INTEGER"), ("b", "VARCHAR")]}
    assert docgen.undocumented(columns, docs, shared) == ["t.b"]
    docgen.parse("-- @column *.b: a shared b\n", "x.sql", docs, shared)
    assert docgen.undocumented(columns, docs, shared) == []


def test_the_table_reference_in_the_docs_is_current():
    text = LEDGER_MD.read_text()
    assert docgen.BEGIN in text and docgen.END in text
    assert docgen.splice(text, docgen.generated()) == text, \
        "docs/LEDGER.md is stale: run `python -m inferledger.ledger.docgen --write`"


def test_the_list_of_gap_declaring_modules_in_the_docs_is_current():
    text = LEDGER_MD.read_text()
    listed = docgen.gap_modules()
    assert docgen.splice(text, listed, docgen.GAPS_BEGIN, docgen.GAPS_END) == text, \
        "docs/LEDGER.md is stale: run `python -m inferledger.ledger.docgen --write`"
    assert "| `ledger/figures.sql` | task | `figures_gaps` | a subtraction across clock domains" in listed
    assert "| `ledger/load.py` | run | `load_gaps` |" in listed


def test_a_gap_declaring_module_without_its_gaps_comment_is_named():
    assert docgen.gaps_text("-- @gaps: one thing;\n--   and another.\nCREATE ...") == "one thing; and another"
    assert docgen.gaps_text("# no gaps here\n") is None


def test_no_doc_says_energy_per_good_result_subtracts_the_idle_term():
    # the ledger adds the window's energy, idle time included, and keeps the idle power a term of its
    # own (idle_gpu_j, idle_cpu_j); tests/test_energy_ledger.py holds the SQL to that
    for doc in sorted((LEDGER_MD.parent).glob("*.md")):
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if "energy_per_good_j" in line:
                assert not re.search(r"subtract\w*\s+(the\s+)?idle", line), f"{doc.name}:{n}: {line}"
