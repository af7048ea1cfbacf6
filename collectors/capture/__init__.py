"""Capture orchestration: one run of a workload against a target, recorded into a run directory.

`run.capture` drives it; `embedded` holds the in-process engine behind its HTTP front end;
`interrupt` turns SIGINT and SIGTERM into a clean stop that keeps what was recorded.
"""
