"""The terminal summary printed after reconstruct, on a hand-computed archive."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from inferledger.cli.summary import print_summary
from inferledger.collectors.importer import import_archive
from inferledger.ledger.reconstruct import reconstruct

E0 = Path(__file__).resolve().parent.parent / "samples" / "e0"


def test_summary_sets_the_peers_readings_beside_ours(tmp_path):
    run = tmp_path / "peers"
    import_archive(E0 / "peer_definitions" / "archive.jsonl", run)
    console = Console(record=True, width=200)
    print_summary(reconstruct(run).path, console)
    text = console.export_text()
    # the rows of samples/e0/peer_definitions/README.md: metric, tool, weighting, n, p50, p99
    for row in (("TTFT", "inferledger", "request", "2", "85.0", "109.5"),
                ("TTFT", "vLLM bench", "request", "2", "70.0", "99.4"),
                ("ITL", "vLLM bench", "gap", "8", "20.0", "39.3"),
                ("ITL", "GuideLLM", "token (tokens − 1)", "2", "15.0", "20.0"),
                ("TPOT", "GuideLLM", "token", "2", "34.0", "34.0")):
        line = next(ln for ln in text.splitlines() if f" {row[0]} " in ln and f" {row[1]} " in ln)
        assert line.split("│")[1:-1] and [c.strip() for c in line.split("│")[1:-1]] == list(row), line
    # every row has samples here; no thresholds declared, so no vLLM-style goodput (not a zero)
    assert "MLPerf-style" in text and "vLLM-style goodput" not in text
    # no verdicts: A1 and A2 are unjudged; A3 timed out, so it is judged not good
    assert "good results (correct and on time): 0 of 1 judged, 3 attempts" in text
