"""Capture orchestration: one run of a workload against a target, recorded into a run directory.

`run.capture` drives it in named steps (the embedded target is serve/lifecycle.py's `Serving`), its
options one `options.CaptureOptions`, what the steps hand each other typed in `steps`; `manifest`
writes the manifest from the first second to the end; `speed_probe` measures the engine's speed for calibration;
`interrupt` turns SIGINT and SIGTERM into a clean stop that keeps what was recorded; `servers` joins
the `serve --out` folders of a URL target (`capture --server`).
"""

SERVER_WAIT_S = 30.0  # after the load: how long --server folders get to flush the end of this run's attempts
