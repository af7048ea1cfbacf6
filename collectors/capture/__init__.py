"""Capture orchestration: one run of a workload against a target, recorded into a run directory.

`run.capture` drives it (the embedded target is serve/lifecycle.py's `Serving`); `manifest` writes the
manifest from the first second to the end; `speed_probe` measures the engine's speed for calibration;
`interrupt` turns SIGINT and SIGTERM into a clean stop that keeps what was recorded.
"""
