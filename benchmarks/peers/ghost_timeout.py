"""The vLLM recipe's injected client timeout, calibrated to the engine it runs against.

A ghost-load demonstration needs the injected timeout to fire while vLLM is still working on the
request. A fixed 300 ms does on two busy cores and does not on a fast machine, where vLLM answers
first. So `vllm_capture.sh` first probes the running vLLM, unloaded, with a few streamed chats shorter
than the workload's (a question of the task set without the workload's filler, so a shorter prefill)
and takes the fastest time to the first content chunk; the injected timeout becomes half of it. Under
the workload's load every request's first token comes later than that, so each injected timeout
fires before vLLM has produced anything and the whole answer is server work after the client gave up.

    python benchmarks/peers/ghost_timeout.py --url http://127.0.0.1:18100 --model smollm2 \
        samples/workloads/vllm_cpu.toml OUT.toml
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import urllib.request
from pathlib import Path

FRACTION = 0.5  # of the fastest unloaded time to the first content chunk
FLOOR_MS = 1.0  # the load client's timeout needs a positive number
PROBES = 3


def calibrated_timeout_ms(fastest_ttft_ms: float) -> float:
    if not fastest_ttft_ms > 0:
        raise ValueError(f"the fastest probe's time to first content must be positive, got {fastest_ttft_ms}")
    return max(FLOOR_MS, math.floor(fastest_ttft_ms * FRACTION * 10) / 10)  # to 0.1 ms, never later


def calibrated_workload(src: Path, timeout_ms: float) -> str:
    """The workload's text with [inject] timeout_ms set and its task set's path made absolute (the copy
    is written elsewhere); everything else byte for byte."""
    text = src.read_text()
    inject = re.search(r"(?ms)^\[inject\]\s*$(.*?)(?=^\[|\Z)", text)
    if inject is None or not re.search(r"(?m)^timeout_ms\s*=", inject.group(1)):
        raise ValueError(f"{src}: no [inject] timeout_ms to calibrate")
    body = re.sub(r"(?m)^timeout_ms\s*=\s*[0-9.]+", f"timeout_ms = {timeout_ms}", inject.group(1), count=1)
    text = text[:inject.start(1)] + body + text[inject.end(1):]

    def absolute(m: re.Match) -> str:
        return f'{m.group(1)}"{(src.parent / m.group(2)).resolve()}"'
    return re.sub(r'(?m)^(file\s*=\s*)"([^"]+)"', absolute, text)


def first_question(src: Path) -> str:
    tasks = re.search(r'(?ms)^\[taskset\].*?^file\s*=\s*"([^"]+)"', src.read_text())
    if tasks is None:
        raise ValueError(f"{src}: no [taskset] file")
    line = (src.parent / tasks.group(1)).read_text().splitlines()[0]
    return json.loads(line)["prompt"]


def probe_ttft_ms(url: str, model: str, prompt: str, *, max_tokens: int = 16, timeout_s: float = 600) -> float:
    """Time from sending one streamed chat to its first chunk with content, in ms."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                       "max_tokens": max_tokens, "temperature": 0.0}).encode()
    req = urllib.request.Request(f"{url.rstrip('/')}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            delta = (json.loads(line[5:]).get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content"):
                return (time.perf_counter() - t0) * 1000
    raise RuntimeError(f"{url}: the probe's stream ended without content")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("workload", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    prompt = first_question(args.workload)
    fastest = min(probe_ttft_ms(args.url, args.model, prompt) for _ in range(PROBES))
    timeout_ms = calibrated_timeout_ms(fastest)
    args.out.write_text(calibrated_workload(args.workload, timeout_ms))
    print(f"ghost_timeout.py: fastest unloaded time to first content {fastest:.1f} ms over {PROBES} probes: "
          f"injected timeout_ms = {timeout_ms} in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
