"""Studies: the book's experiments as one command each (`inferledger study NAME`).

A study is a set of runs that differ in one knob and one comparison that answers a question from their
ledgers. `framework.py` runs a study into a study folder (probes/study_dir.py); each study is one module
listed in `registry.py`; docs/STUDIES.md says what each asks and how to read its answer. This package
orchestrates the producers of runs (collectors: capture, the simulated clock), the ledger and the
report, so only the command line and the Python API import it.
"""
