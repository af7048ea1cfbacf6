#!/usr/bin/env bash
# vLLM's router (vllm-router 0.1.17, a prebuilt Rust wheel) as a real peer: install into
# .peers/vllm-router, start / stop it on 127.0.0.1 in front of the replicas you name.
#
#   bash benchmarks/peers/vllm_router.sh install                     install when missing
#   bash benchmarks/peers/vllm_router.sh start URL [URL...]           start in the background, wait until it answers
#   bash benchmarks/peers/vllm_router.sh stop                         stop the router started by `start` on ROUTER_PORT
#   bash benchmarks/peers/vllm_router.sh status                       print pid, port and health
#   bash benchmarks/peers/vllm_router.sh recipe [OUT]                 the recorded samples' run (samples/peers/vllm_router/README.md):
#                                                                     two `serve --out` replicas behind the router, one capture
#   (recipe's environment: REPLICA1_ARGS / REPLICA2_ARGS, appended to that replica's `inferledger serve`;
#    LOAD_ARGS, the capture's load flags, default "--request-rate 4"; NUM_PROMPTS, the attempts, default 20;
#    LLAMACPP_REPLICA=1: the second replica is llama.cpp's own server (benchmarks/peers/llamacpp.sh, port
#    18210), declared to the capture as --replica URL=llamacpp, the first served as `smollm2` like it;
#    LLAMACPP_REPLICA=2: both replicas are llama.cpp servers (ports 18210 and 18211, one thread each), no
#    replica of ours; each is declared --replica URL=llamacpp and their answers name neither, so the capture
#    places each attempt by the router's spans: ROUTER_RECORD (or ROUTER_TRACES) is required;
#    FAULT=kill: replica1 is killed (SIGKILL) once the router has sent FAULT_AFTER (20) requests; FAULT=slow: replica1 is
#    pinned to core 0 at nice FAULT_NICE (5) beside FAULT_BURNERS (2) CPU burners pinned there too at nice 0
#    (benchmarks/co_tenants.py), replica2 to core 1, for the whole load; WORKLOAD: a workload file under the load flags (-w, e.g. a deadline);
#    ROUTER_RECORD=DIR: the router's own record of the run beside it, DIR/router-spans.jsonl (ROUTER_TRACES) and
#    DIR/router.log (its console at ROUTER_LOG_LEVEL debug); with ROUTER_TRACES the capture gets --router-traces FILE)
#
# Environment: ROUTER_PORT (18200), ROUTER_METRICS_PORT (18201: its Prometheus /metrics), ROUTER_POLICY
# (round_robin; any of the router's --policy), ROUTER_START_TIMEOUT_S (60), ROUTER_LOG_LEVEL (warning),
# ROUTER_EXTRA_ARGS (appended, e.g. "--disable-retries"). Retries are on by default (--retry-max-retries
# 5): an upstream try that fails is tried again, on the same or another worker, and the client never sees it.
# ROUTER_TRACES=FILE: the router runs with its OpenTelemetry tracing on (benchmarks/peers/router_traces.py:
# the CLI has no flag for it) and its spans, one per request and one per upstream try, are appended to FILE
# as OTLP/JSON lines by a receiver on ROUTER_OTLP_PORT (18202); `stop` waits ROUTER_TRACES_FLUSH_S (7) for
# the router's last batch first.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$ROOT/.peers"
PEERS="$(cd "$ROOT/.peers" && pwd -P)"  # physical path: .peers is a symlink in the project's worktrees
VENV="$PEERS/vllm-router"
RUN_DIR="$PEERS/vllm-router-run"
PORT="${ROUTER_PORT:-18200}"
METRICS_PORT="${ROUTER_METRICS_PORT:-18201}"
POLICY="${ROUTER_POLICY:-round_robin}"
START_TIMEOUT_S="${ROUTER_START_TIMEOUT_S:-60}"
PIDFILE="$RUN_DIR/router-$PORT.pid"
LOG="$RUN_DIR/router-$PORT.log"
OTLP_PORT="${ROUTER_OTLP_PORT:-18202}"
TRACES_PIDFILE="$RUN_DIR/traces-$OTLP_PORT.pid"
ROUTER_VERSION=0.1.17
# the OTLP/gRPC receiver of the router's spans (router_traces.py), in the router's venv
RECEIVER_PACKAGES=(grpcio==1.85.4 opentelemetry-proto==1.45.2)
INSTALLED="$ROUTER_VERSION ${RECEIVER_PACKAGES[*]}"

NAME=router
die() { echo "vllm_router.sh: error: $*" >&2; exit 1; }
say() { echo "vllm_router.sh: $*" >&2; }
# shellcheck source=server_lib.sh
source "$ROOT/benchmarks/peers/server_lib.sh"

install() {
  if [[ -f "$VENV/.installed" ]] && [[ "$(cat "$VENV/.installed")" == "$INSTALLED" ]]; then
    say "already installed ($VENV)"; return 0
  fi
  test -x "$VENV/bin/python" || python3 -m venv "$VENV" || die "could not create venv $VENV"
  "$VENV/bin/python" -m pip install -q "vllm-router==$ROUTER_VERSION" "${RECEIVER_PACKAGES[@]}" \
    || die "pip could not install vllm-router==$ROUTER_VERSION ${RECEIVER_PACKAGES[*]}"
  "$VENV/bin/vllm-router" --help >/dev/null || die "vllm-router does not start from $VENV"
  echo "$INSTALLED" > "$VENV/.installed"
  say "installed: $VENV"
}

healthy() { curl -fsS -m 2 "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; }

start() {
  [[ $# -ge 1 ]] || die "start needs the replicas' URLs (e.g. http://127.0.0.1:18111 http://127.0.0.1:18112)"
  [[ -x "$VENV/bin/vllm-router" ]] || die "not installed: run \`bash benchmarks/peers/vllm_router.sh install\`"
  mkdir -p "$RUN_DIR"
  if peer_alive; then die "a router already runs on $PORT (pid $(cat "$PIDFILE"))"; fi
  local router=("$VENV/bin/vllm-router")
  if [[ -n "${ROUTER_TRACES:-}" ]]; then
    traces_receiver_start
    router=("$VENV/bin/python" "$ROOT/benchmarks/peers/router_traces.py" router "http://127.0.0.1:$OTLP_PORT")
  fi
  # shellcheck disable=SC2086
  nohup "${router[@]}" --host 127.0.0.1 --port "$PORT" --worker-urls "$@" --policy "$POLICY" \
    --prometheus-host 127.0.0.1 --prometheus-port "$METRICS_PORT" --log-level "${ROUTER_LOG_LEVEL:-warning}" \
    --worker-startup-timeout-secs "$START_TIMEOUT_S" --worker-startup-check-interval 1 ${ROUTER_EXTRA_ARGS:-} \
    >"$LOG" 2>&1 &
  echo $! > "$PIDFILE"
  peer_wait_healthy 0.5
  say "router on http://127.0.0.1:$PORT (metrics http://127.0.0.1:$METRICS_PORT/metrics, policy $POLICY, pid $(cat "$PIDFILE"))"
}

# ROUTER_TRACES: the receiver writing the router's spans to that file, started before the router
traces_receiver_start() {
  if [[ -f "$TRACES_PIDFILE" ]] && kill -0 "$(cat "$TRACES_PIDFILE")" 2>/dev/null; then
    die "a trace receiver already runs on $OTLP_PORT (pid $(cat "$TRACES_PIDFILE"))"
  fi
  mkdir -p "$(dirname "$ROUTER_TRACES")"
  nohup "$VENV/bin/python" "$ROOT/benchmarks/peers/router_traces.py" receive "$OTLP_PORT" "$ROUTER_TRACES" \
    >"$RUN_DIR/traces-$OTLP_PORT.log" 2>&1 &
  echo $! > "$TRACES_PIDFILE"
  for _ in $(seq 1 40); do (exec 3<>"/dev/tcp/127.0.0.1/$OTLP_PORT") 2>/dev/null && return 0; sleep 0.25; done
  die "the trace receiver did not listen on $OTLP_PORT (log $RUN_DIR/traces-$OTLP_PORT.log)"
}

stop() {
  local receiver=""
  [[ -f "$TRACES_PIDFILE" ]] && receiver="$(cat "$TRACES_PIDFILE")"
  if [[ -n "$receiver" ]] && peer_alive; then sleep "${ROUTER_TRACES_FLUSH_S:-7}"; fi  # the router's last span batch
  peer_stop 20 0.25
  if [[ -n "$receiver" ]]; then
    kill -TERM "$receiver" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$receiver" 2>/dev/null || break; sleep 0.25; done
    rm -f "$TRACES_PIDFILE"
    say "stopped the trace receiver (pid $receiver, port $OTLP_PORT)"
  fi
}

status() {
  if peer_alive; then
    echo "pid $(cat "$PIDFILE") port $PORT metrics $METRICS_PORT health $(healthy && echo ok || echo no)"
  else
    echo "not running (port $PORT)"
  fi
}

# The recorded sample: two `inferledger serve --out` replicas of the bundled 135M model behind the
# router, one capture through it joining both folders and scraping the router's counters. Every
# process it starts is stopped on exit, whatever happens.
REPLICA_PIDS=()
LLAMACPP_PORTS=()  # the llama.cpp servers `recipe` started (LLAMACPP_REPLICA)
FAULT_PID=""
cleanup() {  # the router and every replica `recipe` started (globals: the EXIT trap runs after its locals are gone)
  stop || true
  if [[ -n "$FAULT_PID" ]]; then kill -TERM "$FAULT_PID" 2>/dev/null || true; wait "$FAULT_PID" 2>/dev/null || true; fi
  FAULT_PID=""
  local port
  for port in "${LLAMACPP_PORTS[@]}"; do LLAMACPP_PORT=$port bash "$ROOT/benchmarks/peers/llamacpp.sh" stop || true; done
  LLAMACPP_PORTS=()
  for p in "${REPLICA_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  for p in "${REPLICA_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  REPLICA_PIDS=()
}

# FAULT (see the header): started beside the capture, in the background (FAULT_PID), stopped by cleanup.
fault() {
  local work=$1 victim=${REPLICA_PIDS[0]:-}
  case "${FAULT:-}" in
    "") ;;
    kill)
      ( until [[ "$(curl -fsS -m 2 "http://127.0.0.1:$METRICS_PORT/metrics" 2>/dev/null \
                  | awk '/^vllm_router_processed_requests_total/ {n += $NF} END {print n + 0}')" -ge "${FAULT_AFTER:-20}" ]]
        do sleep 0.2; done
        kill -KILL "$victim" && say "killed replica1 (pid $victim, SIGKILL) once the router had sent ${FAULT_AFTER:-20}" ) &
      FAULT_PID=$! ;;
    slow)
      # the co-tenant outweighs the replica (nice): the host's other jobs are not pinned and move between cores
      taskset -a -p -c 0 "$victim" >/dev/null && taskset -a -p -c 1 "${REPLICA_PIDS[1]}" >/dev/null
      for t in /proc/"$victim"/task/*; do renice -n "${FAULT_NICE:-5}" -p "${t##*/}" >/dev/null; done  # every thread
      local burn='import signal, sys
sys.path.insert(0, sys.argv[1])
from co_tenants import CoTenants  # each burner (spawned) inherits this process'"'"'s core: taskset -c 0
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
with CoTenants(int(sys.argv[2])):
    signal.pause()'
      taskset -c 0 "$ROOT/.venv/bin/python" -c "$burn" "$ROOT/benchmarks" "${FAULT_BURNERS:-2}" >"$work/burners.log" 2>&1 &
      FAULT_PID=$!
      say "slowed replica1 (pid $victim): pinned to core 0 at nice ${FAULT_NICE:-5} beside ${FAULT_BURNERS:-2} burner(s)" \
          "at nice 0, replica2 to core 1" ;;
    *) die "FAULT=$FAULT: kill or slow" ;;
  esac
}

recipe() {
  local out="${1:-$ROOT/samples/peers/vllm_router/run}" work; work="$(mktemp -d)"
  local il="$ROOT/.venv/bin/inferledger"
  if [[ -n "${ROUTER_RECORD:-}" ]]; then
    mkdir -p "$ROUTER_RECORD" && rm -f "$ROUTER_RECORD/router-spans.jsonl" "$ROUTER_RECORD/router.log"
    export ROUTER_TRACES="$ROUTER_RECORD/router-spans.jsonl" ROUTER_LOG_LEVEL="${ROUTER_LOG_LEVEL:-debug}"
  fi
  trap cleanup EXIT
  local extra ours=(1 2) workers=(http://127.0.0.1:18111 http://127.0.0.1:18112) replicas=(--server "$work/replica1"
                                                                                    --server "$work/replica2") name=()
  case "${LLAMACPP_REPLICA:-}" in
    "") ;;
    1) ours=(1) LLAMACPP_PORTS=(18210) name=(--served-model-name smollm2) ;;
    2) ours=() LLAMACPP_PORTS=(18210 18211) name=(--served-model-name smollm2) replicas=()
       [[ -n "${ROUTER_TRACES:-}" ]] || die "LLAMACPP_REPLICA=2 places each attempt by the router's spans: give ROUTER_RECORD=DIR"
       [[ -z "${FAULT:-}" ]] || die "FAULT=$FAULT acts on replica1 of ours: there is none with LLAMACPP_REPLICA=2" ;;
    *) die "LLAMACPP_REPLICA=$LLAMACPP_REPLICA: 1 (beside a replica of ours) or 2 (two llama.cpp replicas)" ;;
  esac
  if [[ ${#LLAMACPP_PORTS[@]} -gt 0 ]]; then
    workers=("${ours[@]/#/http://127.0.0.1:1811}")
    for port in "${LLAMACPP_PORTS[@]}"; do
      LLAMACPP_PORT=$port bash "$ROOT/benchmarks/peers/llamacpp.sh" start
      workers+=("http://127.0.0.1:$port") replicas+=(--replica "http://127.0.0.1:$port=llamacpp")
    done
    [[ ${#ours[@]} -eq 0 ]] || replicas=(--server "$work/replica1" "${replicas[@]}")
  fi
  for i in "${ours[@]}"; do
    extra="REPLICA${i}_ARGS"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 "$il" serve --port "1811$i" --max-num-seqs 2 "${name[@]}" --out "$work/replica$i" ${!extra:-} \
      >"$work/replica$i.log" 2>&1 &
    REPLICA_PIDS+=($!)
  done
  for i in "${ours[@]}"; do
    for _ in $(seq 1 240); do curl -fsS -m 2 "http://127.0.0.1:1811$i/health" >/dev/null 2>&1 && break; sleep 0.5; done
  done
  start "${workers[@]}"
  rm -rf "$out"
  fault "$work"
  local workload=(); [[ -z "${WORKLOAD:-}" ]] || workload=(-w "$WORKLOAD")
  [[ -z "${ROUTER_TRACES:-}" ]] || workload+=(--router-traces "$ROUTER_TRACES")
  "$il" capture -o "$out" "${workload[@]}" "${name[@]}" --target "http://127.0.0.1:$PORT" \
    --router-metrics "http://127.0.0.1:$METRICS_PORT/metrics" "${replicas[@]}" \
    --num-prompts "${NUM_PROMPTS:-20}" --seed 0 --input-len 64 --output-len 8 --ignore-eos ${LOAD_ARGS:---request-rate 4}
  cleanup
  trap - EXIT
  rm -rf "$work"
  # the router's console without colour codes (its --log-dir file has the same lines)
  if [[ -n "${ROUTER_RECORD:-}" ]]; then sed 's/\x1b\[[0-9;]*m//g' "$LOG" > "$ROUTER_RECORD/router.log"; fi
}

case "${1:-}" in
  install) install ;;
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  recipe) shift; recipe "$@" ;;
  *) echo "usage: $0 install|start URL...|stop|status|recipe [OUT]" >&2; exit 2 ;;
esac
