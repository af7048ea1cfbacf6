"""inferledger.report: what is drawn or exported from a run's ledger, reading only ledger tables.

`build.build_report` writes the HTML report; `export.export_run` writes a Perfetto trace or OTLP
spans; `summary` gives the rows of the terminal summary. docs/REPORT.md lists each panel's table.
"""
