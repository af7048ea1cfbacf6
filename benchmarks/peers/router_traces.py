"""vllm-router 0.1.17's own per-try record: its OpenTelemetry spans, which only its Python API turns on.

The router's logs do not name the request a try belonged to unless its tracing is on, and even then
name the worker only for a try that could not be sent (docs/PEERS.md "vLLM's router"); its OTLP spans
hold every upstream try: a CLIENT span per try (`url.full` the worker, `http.response.status_code`,
status `HTTP 503` / an error, start and end in ns) under the SERVER span of the client's request
(`request_id` its X-Request-Id), both in the client's trace (the router continues `traceparent`). The
CLI has no flag for it (`enable_trace`, `otlp_traces_endpoint` are arguments of the Rust `Router` only),
and it exports over OTLP/gRPC alone, so this script is both halves, run with the router's venv
(`benchmarks/peers/vllm_router.sh install` adds grpcio and opentelemetry-proto to it):

    python router_traces.py receive PORT FILE          an OTLP/gRPC trace receiver on 127.0.0.1:PORT that
                                                       appends each export to FILE as one OTLP/JSON line
                                                       (hex ids: the Collector file exporter's format;
                                                       `inferledger capture --router-traces FILE` joins it)
    python router_traces.py router ENDPOINT ARGS...    `vllm-router ARGS...` with its tracing on, exporting
                                                       to ENDPOINT (e.g. http://127.0.0.1:18202)
"""
from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
from concurrent import futures

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
IDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(obj):
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping writes bytes as base64."""
    if isinstance(obj, dict):
        return {k: (base64.b64decode(v).hex() if k in IDS and isinstance(v, str) else _hex_ids(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids(v) for v in obj]
    return obj


def receive(port: int, path: str) -> None:
    import grpc
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as ts

    lock, out = threading.Lock(), open(path, "a", encoding="utf-8")

    def export(req, _ctx):
        line = json.dumps(_hex_ids(MessageToDict(req)), separators=(",", ":"))
        with lock:
            out.write(line + "\n")
            out.flush()
        return ts.ExportTraceServiceResponse()

    handler = grpc.method_handlers_generic_handler(SERVICE, {"Export": grpc.unary_unary_rpc_method_handler(
        export, request_deserializer=ts.ExportTraceServiceRequest.FromString,
        response_serializer=ts.ExportTraceServiceResponse.SerializeToString)})
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port(f"127.0.0.1:{port}") == 0:
        sys.exit(f"router_traces.py: error: cannot listen on 127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=2).wait()  # the exports in flight are written
    out.close()


def _prime(host: str, port: int) -> None:
    """vllm-router 0.1.17 traced never exports the spans of the first streamed chat request it serves when
    nothing went through it before (measured with a streaming stub replica: that request's SERVER and
    CLIENT spans never reached the receiver, in 60 s or at shutdown; every later request's did, about 6 s
    after it). One GET /v1/models through it first (proxied to a worker, not in its request counters)
    and the first chat request's spans come like the others'. Done once, as soon as it answers /health."""
    import time
    import urllib.request

    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
    for _ in range(480):
        try:
            urllib.request.urlopen(base + "/health", timeout=1).close()
            break
        except OSError:
            time.sleep(0.25)
    else:
        return
    try:
        urllib.request.urlopen(base + "/v1/models", timeout=10).close()
    except OSError:
        pass


def router(endpoint: str, argv: list[str]) -> None:
    from vllm_router.launch_router import parse_router_args
    from vllm_router.router import Router, policy_from_str
    from vllm_router_rs import Router as RustRouter

    args = vars(parse_router_args(argv))  # Router.from_args, plus the two arguments the CLI lacks
    if args.pop("mini_lb") or args["vllm_pd_disaggregation"] or args["service_discovery"]:
        sys.exit("router_traces.py: error: only the regular mode (--worker-urls) is launched here")
    for key in ("policy", "prefill_policy", "decode_policy"):
        args[key] = policy_from_str(args[key])
    args.update(prefill_urls=None, decode_urls=None, enable_trace=True, otlp_traces_endpoint=endpoint)
    # a process of its own: the router's start() holds this one (a thread here never ran)
    subprocess.Popen([sys.executable, __file__, "prime", str(args["host"]), str(args["port"])])
    Router(router=RustRouter(**args)).start()


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "receive":
        receive(int(sys.argv[2]), sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "prime":
        _prime(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "router":
        router(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__.split("\n\n")[-1])


if __name__ == "__main__":
    main()
