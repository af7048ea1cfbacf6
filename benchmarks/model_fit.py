"""The workload model against the reference engine on this CPU: bounds that hold, a fit that predicts.

    python benchmarks/model_fit.py [--tokens 10] [--repeat 1]

Two engine runs of the bundled model at the resolved dtype, each written as a run directory and
rebuilt by the ledger, with the device's roofs measured first (the capture's microbenchmarks,
collectors/capture/microbench.py, recorded as the manifest's `device_params`):

- run A (training): waves of 1, 2 and 4 concurrent requests at prompt lengths 16, 96 and 384 tokens;
- run B (held-out workload): waves of 3 and 6 requests at prompts of 48 and 192 tokens.

Figures: the share of steps faster than their lower bound (target <= 1 %); run A's step fit on its
held-out shapes and applied to run B, median and p90 |error| (targets <= 5 % and <= 15 %); run B's
request-level TTFT and TPOT predicted from the steps each request was in, with run A's fit (the
manifest's `step_fit`), median |error| (target <= 10 %).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)

RUN_A = ((1, 16), (2, 16), (4, 16), (1, 96), (2, 96), (4, 96), (1, 384), (2, 384), (4, 384))
RUN_B = ((3, 48), (6, 48), (3, 192), (6, 192))


def capture(bundle, run_dir: Path, waves, tokens: int, device_params: dict) -> None:
    """An engine-only run: each wave's requests added together and stepped until all finish."""
    from inferledger.collectors.rundir.writer import RunWriter
    from inferledger.engine import EngineConfig, LLMEngine, SamplingParams

    vocab = bundle.tokenizer.vocab_size
    with RunWriter(run_dir, run_id=run_dir.name) as writer:
        engine = LLMEngine(bundle, EngineConfig(enable_prefix_caching=False), sink=writer, run_id=run_dir.name)
        writer.write_manifest({"run_id": run_dir.name, "source": "benchmarks/model_fit.py", **engine.manifest(),
                               "device_params": device_params})
        n = 0
        for batch, prompt in waves:
            for _ in range(batch):
                ids = [(n * 7919 + j * 104729) % (vocab - 100) + 50 for j in range(prompt)]
                engine.add_request(ids, SamplingParams(max_tokens=tokens, ignore_eos=True), request_id=f"r{n:03d}")
                n += 1
            while engine.has_unfinished():
                engine.step()
        engine.close()


def _one(led, sql):
    rows = led.rows(sql)[1]
    return rows[0] if rows else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10, help="output tokens per request")
    a = ap.parse_args(argv)
    rec = results.start("model_fit", vars(a))

    from inferledger.collectors.capture.microbench import device_params
    from inferledger.costmodel.fit import apply
    from inferledger.engine.loader import load_model
    from inferledger.ledger.query import open_ledger
    from inferledger.ledger.reconstruct import reconstruct
    from inferledger.ledger.fit_read import ledger_fit_points, run_fit
    from inferledger.probes.quantile import quantile

    bundle = load_model()
    params = device_params(bundle, max_batch=6)
    root = Path(tempfile.mkdtemp(prefix="model-fit-"))
    try:
        run_a, run_b = root / "a", root / "b"
        capture(bundle, run_a, RUN_A, a.tokens, params)
        capture(bundle, run_b, RUN_B, a.tokens, params)
        for run in (run_a, run_b):
            reconstruct(run)
        fit = run_fit(run_a)
        on_b = apply(fit, ledger_fit_points(run_b))
        manifest = json.loads((run_b / "manifest.json").read_text())  # B judged by A's fit
        (run_b / "manifest.json").write_text(json.dumps({**manifest, "step_fit": fit.to_dict()}))
        reconstruct(run_b)
        beats, steps, roofs = 0, 0, None
        for run in (run_a, run_b):
            with open_ledger(run) as led:
                n_beat, n = _one(led, "SELECT count(*) FILTER (WHERE beats_bound), count(bound_ms) FROM step_model")
                beats, steps = beats + n_beat, steps + n
                roofs = _one(led, "SELECT any_value(roof_source), any_value(roof_compute_tflops), "
                                  "any_value(roof_memory_gbps) FROM step_model")
                if run == run_b:
                    req = led.rows("SELECT ttft_error_pct, tpot_error_pct FROM request_model "
                                   "WHERE basis = 'schedule'")[1]
                    dominant = _one(led, "SELECT source FROM residual_sources WHERE dominant")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ttft = [abs(t) for t, _ in req if t is not None]
    tpot = [abs(p) for _, p in req if p is not None]
    figures = {
        "dtype": str(bundle.dtype).removeprefix("torch."), "threads": params.get("threads"),
        "roof_source": roofs[0], "roof_compute_tflop_per_s": roofs[1], "roof_memory_gb_s": roofs[2],
        "steps": steps, "steps_below_bound": beats, "below_bound_pct": 100.0 * beats / steps if steps else None,
        "fit_alpha_ms": fit.alpha_ms, "fit_p_eff_tflop_per_s": fit.p_eff_tflops, "fit_b_eff_gb_s": fit.b_eff_gbps,
        "fit_gap_alpha_ms": fit.gap_alpha_ms, "fit_gap_per_seq_ms": fit.gap_ms_per_seq,
        "fit_n_train": fit.n_train, "fit_n_held_out": fit.n_held_out,
        "held_out_median_abs_pct": fit.held_out_median_abs_pct, "held_out_p90_abs_pct": fit.held_out_p90_abs_pct,
        "run_b_steps": on_b["n"], "run_b_extrapolated": on_b["n"] - on_b["n_inside"],
        "run_b_median_abs_pct": on_b["median_abs_pct"], "run_b_p90_abs_pct": on_b["p90_abs_pct"],
        "requests_b": len(req), "ttft_median_abs_pct": quantile(ttft, 0.5), "tpot_median_abs_pct": quantile(tpot, 0.5),
        "dominant_residual": dominant[0] if dominant else None,
    }
    targets = {"below_bound_pct": 1.0, "held_out_median_abs_pct": 5.0, "held_out_p90_abs_pct": 15.0,
               "run_b_median_abs_pct": 5.0, "run_b_p90_abs_pct": 15.0, "ttft_median_abs_pct": 10.0,
               "tpot_median_abs_pct": 10.0}
    figures["targets"] = [{"figure": k, "target_pct": v, "measured_pct": figures[k],
                           "met": None if figures[k] is None else figures[k] <= v} for k, v in targets.items()]
    path = rec.write(figures)
    print(json.dumps(figures, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
