#!/usr/bin/env bash
# Stop the Samba DC that tests/samba/start-dc.sh started in STATE_DIR (its pid file only; the
# samba parent was started with setsid, so its process group holds all its children).
set -euo pipefail
state=${1:?usage: stop-dc.sh STATE_DIR}
pidfile=$state/dc/run/airlock-samba.pid
[ -f "$pidfile" ] || exit 0
pid=$(cat "$pidfile")
if kill -0 "$pid" 2>/dev/null; then
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
  kill -KILL -- "-$pid" 2>/dev/null || true
fi
rm -f "$pidfile"
