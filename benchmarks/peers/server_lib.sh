# The start / stop / status that the peer server scripts share (sourced, not run). Before sourcing, a
# script sets NAME (the server's name in messages), PORT, PIDFILE, LOG and START_TIMEOUT_S, and defines
# `healthy` (its health check), `say` and `die` and its own `stop`.

peer_alive() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

# After the server was started in the background (its pid in PIDFILE): until `healthy` answers, checking
# every $1 seconds; the server exiting first (its log's tail shown) or START_TIMEOUT_S passing is fatal.
peer_wait_healthy() {
  local step="${1:-1}" t0=$SECONDS
  until healthy; do
    if ! peer_alive; then tail -n 30 "$LOG" >&2; rm -f "$PIDFILE"; die "$NAME exited during start (log $LOG)"; fi
    if (( SECONDS - t0 >= START_TIMEOUT_S )); then stop; die "$NAME not healthy after ${START_TIMEOUT_S}s (log $LOG)"; fi
    sleep "$step"
  done
  say "$NAME healthy on 127.0.0.1:$PORT after $((SECONDS - t0))s (pid $(cat "$PIDFILE"))"
}

# TERM to the server's process group (its pid alone when it leads none), $1 checks $2 seconds apart for
# it to exit, then KILL.
peer_stop() {
  if ! peer_alive; then rm -f "$PIDFILE"; say "no $NAME of ours runs on port $PORT"; return 0; fi
  local pid; pid="$(cat "$PIDFILE")"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 "${1:-20}"); do kill -0 "$pid" 2>/dev/null || break; sleep "${2:-0.5}"; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  rm -f "$PIDFILE"
  say "stopped $NAME (pid $pid, port $PORT)"
}

peer_status() {
  if peer_alive; then echo "pid $(cat "$PIDFILE") port $PORT $(healthy && echo healthy || echo starting)"
  else echo "not running (port $PORT)"; fi
}
