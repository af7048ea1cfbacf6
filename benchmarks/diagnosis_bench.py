"""The diagnosis bench: runs whose first cause is known by construction, and the confusion table of
`run_diagnosis.first_cause` over them.

    python benchmarks/diagnosis_bench.py [--scale default|tiny] [--cases server_queue,preemption] [--out DIR]

Each case is one capture of the embedded engine on the bundled model, built so that one cause of delay
outweighs the others:

- server_queue: every request arrives at once and the engine runs one at a time (max_num_seqs = 1);
- prefill_interference: a few long decodes, then long prompts landing among them one after another,
  chunked prefill off (a whole prompt in the step beside the decodes);
- preemption: a KV pool too small for the batch's outputs (blocks run out mid-decode);
- host_contention: one request at a time while CPU-burning co-tenants (one per core) run beside
  the engine, started as the load starts;
- client: a load generator whose event loop is blocked after every finished task (as a tool doing
  synchronous work per response is), without using a CPU, so the engine does not share the cause;
- spec_rejected: prompt-lookup speculation with long drafts (k = 8) on prose, where most drafts are
  thrown away.

- transport: a proxy between client and server that holds every byte of each response for a fixed
  delay; the server is `inferledger serve --out S` in a process of its own and the capture, against
  the proxy's URL, joins its folder (`--server S`), so both sides of the link are measured.

Per case the results file records the run's first cause and every share, the steps' CPU wait
fraction (steps' contention over their time) and the load average before and after; the table's rows
are the constructed causes, its columns the causes named. tests/test_diagnosis_bench.py runs the
tiny scale of the cases a test host's load cannot overturn.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from inferledger.serve.local import free_port, wait_healthy  # noqa: E402
from inferledger.studies.load import CAUSES  # noqa: E402  (run_diagnosis' causes, in its order)


@dataclass
class Case:
    """One constructed run: its workload, engine settings and what runs beside the load."""
    cause: str
    workload: object  # a checked Workload
    max_num_seqs: int
    engine_config: dict = field(default_factory=dict)
    co_tenants: int = 0  # CPU burners started as the load starts, stopped after it
    client_block_s: float = 0.0  # the client's loop blocked this long after each finished task
    link_delay_s: float = 0.0  # a separate server behind a proxy that delays its responses this long


def _wl(name: str, classes: list[dict], max_tokens: int, arrivals_ms: list[float] | None = None,
        arrivals: dict | None = None):
    from inferledger.studies.real import workload

    return workload(name, classes, max_tokens=max_tokens, arrivals_ms=arrivals_ms, arrivals=arrivals)


def server_queue(scale: str) -> Case:
    n = 4 if scale == "tiny" else 12
    return Case("server_queue", _wl("queue", [{"name": "q", "prompt_tokens": 32}], 16, arrivals_ms=[0.0] * n), 1)


def prefill_interference(scale: str) -> Case:
    # decoders (32-token prompts, long outputs) and long prompts alternate in task order (equal weights):
    # decoder i arrives once long prompt i−1's prefill is done (so it does not queue behind it), long
    # prompt i 100 ms after it; each decoder then decodes through every later long prompt's prefill
    pairs = 2 if scale == "tiny" else 5
    long_tokens, spacing_ms = (512, 450.0) if scale == "tiny" else (960, 800.0)
    arrivals = [t for i in range(pairs) for t in (i * spacing_ms, i * spacing_ms + 100.0)]
    classes = [{"name": "decoder", "prompt_tokens": 32, "max_tokens": 80 if scale == "tiny" else 160},
               {"name": "long", "prompt_tokens": long_tokens, "max_tokens": 2}]
    return Case("prefill_interference", _wl("interference", classes, 96, arrivals_ms=arrivals), 16,
                {"chunked_prefill": False, "max_num_batched_tokens": 2048, "enable_prefix_caching": False})


def preemption(scale: str) -> Case:
    # tiny: 4 requests of 32 prompt + 48 output tokens need 4 x 5 blocks of 16; the pool holds 11
    # (default: 6 x (32 + 96) tokens, 6 x 8 blocks, in 18). Every prompt still finds room at its first
    # admission when some requests reached the engine a step before the others (k of them decoding hold
    # 3 blocks each, the others' prompts 2: 8 + k <= 11), as on a busy host: no first-admission wait
    # (server_queue), the delay is the preemptions'
    n, out, blocks = (4, 48, 11) if scale == "tiny" else (6, 96, 18)
    return Case("preemption", _wl("preemption", [{"name": "p", "prompt_tokens": 32}], out, arrivals_ms=[0.0] * n), n,
                {"num_blocks": blocks, "enable_prefix_caching": False})


def host_contention(scale: str) -> Case:
    n, out = (2, 16) if scale == "tiny" else (8, 32)
    wl = _wl("contention", [{"name": "c", "prompt_tokens": 32}], out,
             arrivals={"process": "closed", "concurrency": 1, "n_tasks": n})
    # one burner per core; at the tiny scale (the tests, beside another test worker) one is enough
    return Case("host_contention", wl, 1, co_tenants=1 if scale == "tiny" else os.cpu_count() or 2)


def client(scale: str) -> Case:
    # a request every 120 ms, and the client's loop blocked 0.4 s after each finished one: sends put off,
    # first and last chunks read late
    n = 6 if scale == "tiny" else 16
    arrivals = [i * 120.0 for i in range(n)]
    return Case("client", _wl("client", [{"name": "c", "prompt_tokens": 32}], 24, arrivals_ms=arrivals), 16,
                client_block_s=0.4)


def spec_rejected(scale: str) -> Case:
    n, out = (2, 32) if scale == "tiny" else (6, 48)
    wl = _wl("spec", [{"name": "s", "prompt_tokens": 40}], out,
             arrivals={"process": "closed", "concurrency": 1, "n_tasks": n})
    return Case("spec_rejected", wl, 1, {"speculative": {"method": "prompt_lookup", "k": 8, "ngram_min": 1}})


def transport(scale: str) -> Case:
    n = 2 if scale == "tiny" else 8
    wl = _wl("transport", [{"name": "t", "prompt_tokens": 32}], 8,
             arrivals={"process": "closed", "concurrency": 1, "n_tasks": n})
    # tiny: 1 s, so that the link still outweighs what a loaded test host adds to the client's own time
    return Case("transport", wl, 1, link_delay_s=1.0 if scale == "tiny" else 0.5)


BUILDERS: dict[str, Callable[[str], Case]] = {f.__name__: f for f in (
    server_queue, prefill_interference, preemption, host_contention, client, spec_rejected, transport)}


class DelayingProxy:
    """A TCP proxy on loopback, in a process of its own (benchmarks/peers/delaying_proxy.py): requests pass at
    once, every chunk of a response is passed on `delay_s` after it left the server (order kept), as a
    slow link would."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        proxy = Path(__file__).parent / "peers" / "delaying_proxy.py"
        self.args = [sys.executable, str(proxy), str(upstream_port), str(delay_s)]

    def __enter__(self) -> "DelayingProxy":
        import subprocess

        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.proc.kill()
            raise RuntimeError(f"the delaying proxy did not start ({' '.join(self.args)} printed {line!r})")
        self.port = int(line)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


class SeparateServer:
    """`inferledger serve --out FOLDER` in a process of its own (the transport case's server)."""

    def __init__(self, folder: Path, engine_args: list[str]) -> None:
        self.folder, self.port = folder, free_port()
        self.args = [sys.executable, "-m", "inferledger.cli.app", "serve", "--port", str(self.port),
                     "--out", str(folder), "--flush-every", "0.5", *engine_args]

    def __enter__(self) -> "SeparateServer":
        import subprocess

        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if wait_healthy(self.proc, f"http://127.0.0.1:{self.port}", 300):
            return self
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=120)
        raise RuntimeError(f"inferledger serve did not start: {err}")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=120)


def run_case(case: Case, run_dir: Path, bundle=None) -> dict:
    """Capture `case` into `run_dir`, rebuild its ledger and return what run_diagnosis says of it."""
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.collectors.capture.run import capture
    from inferledger.ledger.query import open_ledger
    from inferledger.ledger.reconstruct import reconstruct

    from co_tenants import CoTenants

    burners = CoTenants(case.co_tenants)

    def blocked_client() -> None:  # runs in the client's event loop after each task: blocks it, no CPU
        time.sleep(case.client_block_s)

    options = CaptureOptions(max_num_seqs=case.max_num_seqs, engine_config=case.engine_config,
                             run_id=run_dir.name, microbenchmarks=False)
    load_before = os.getloadavg()[0]
    try:
        if case.link_delay_s:
            server_dir = run_dir.with_name(run_dir.name + "-server")
            with SeparateServer(server_dir, ["--max-num-seqs", str(case.max_num_seqs)]) as srv, \
                    DelayingProxy(srv.port, case.link_delay_s) as proxy:
                capture(case.workload, run_dir, CaptureOptions(
                    target=f"http://127.0.0.1:{proxy.port}", servers=(server_dir,), run_id=run_dir.name))
        else:
            capture(case.workload, run_dir, options, bundle=bundle,
                    progress=blocked_client if case.client_block_s else None,
                    on_ready=burners.start if case.co_tenants else None)
    finally:
        burners.stop()
    load_after = os.getloadavg()[0]
    reconstruct(run_dir)
    led = open_ledger(run_dir)
    try:
        cols, rows = led.rows("SELECT first_cause, diagnosed, n_attempts, "
                              + ", ".join(f"{c}_share" for c in CAUSES) + " FROM run_diagnosis WHERE scope = 'run'")
        diag = dict(zip(cols, rows[0]))
        _, wait = led.rows("SELECT sum(contention_ms) / nullif(sum(measured_ms), 0) FROM step_model")
    finally:
        led.close()
    return {"expected": case.cause, "named": diag["first_cause"], "diagnosed": diag["diagnosed"],
            "n_attempts": diag["n_attempts"], "cpu_wait_share": wait[0][0],
            "load_before_1m": load_before, "load_after_1m": load_after,
            "shares": {f"{c}_share": diag[f"{c}_share"] for c in CAUSES}}


def confusion(outcomes: list[dict]) -> tuple[list[str], list[list]]:
    """Rows: the constructed causes; columns: the causes named first (only those that occur)."""
    named = sorted({o["named"] or "none" for o in outcomes}, key=lambda c: (CAUSES + ("unknown", "none")).index(c))
    rows = []
    for cause in dict.fromkeys(o["expected"] for o in outcomes):
        row = [cause] + [sum(1 for o in outcomes if o["expected"] == cause and (o["named"] or "none") == n)
                         for n in named]
        rows.append(row)
    return ["constructed"] + named, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="default", choices=("default", "tiny"))
    ap.add_argument("--cases", default=",".join(BUILDERS), help="comma-separated, of: " + ", ".join(BUILDERS))
    ap.add_argument("--out", type=Path, default=None, help="the folder for the runs (default: a temporary one)")
    a = ap.parse_args(argv)
    names = [c for c in a.cases.split(",") if c]
    unknown = [c for c in names if c not in BUILDERS]
    if unknown:
        ap.error(f"--cases: unknown {', '.join(unknown)}; expected some of {', '.join(BUILDERS)}")
    import results
    from rich.console import Console
    from rich.table import Table as RichTable

    rec = results.start("diagnosis_bench", {"scale": a.scale, "cases": names})
    from inferledger.engine.loader import load_model

    bundle = load_model(None)
    out = a.out or Path(tempfile.mkdtemp(prefix="diagnosis-bench-"))
    outcomes = []
    for name in names:
        t0 = time.perf_counter()
        o = run_case(BUILDERS[name](a.scale), out / name, bundle)
        o["wall_s"] = round(time.perf_counter() - t0, 1)
        outcomes.append(o)
        share = o["shares"].get(f"{o['named']}_share")
        print(f"{name}: named {o['named']} (share {share}), "
              f"CPU wait {o['cpu_wait_share']}, load {o['load_before_1m']:.2f} -> {o['load_after_1m']:.2f}",
              flush=True)
    header, rows = confusion(outcomes)
    table = RichTable(title="run_diagnosis.first_cause on runs whose cause is known")
    for h in header:
        table.add_column(h)
    for r in rows:
        table.add_row(*[str(v) for v in r])
    Console().print(table)
    right = sum(o["expected"] == o["named"] for o in outcomes)
    path = rec.write({"cases": outcomes, "confusion": {"columns": header, "rows": rows},
                      "named_right_ratio": right / len(outcomes), "target_met": right == len(outcomes)})
    print(f"{right} of {len(outcomes)} named first; runs {out}; results {path}")
    return 0 if right == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
