#!/usr/bin/env bash
# Stop the Samba DC that tests/samba/start-dc.sh started in STATE_DIR (its pid file only; the
# samba parent was started with setsid, so its process group holds all its children).
set -euo pipefail
state=${1:?usage: stop-dc.sh STATE_DIR}
pidfile=$state/dc/run/airlock-samba.pid
conf=$state/dc/etc/smb.conf
if [ -f "$pidfile" ]; then
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
fi
# smbd starts samba-dcerpcd and its rpcd_* workers on demand, in their own sessions: they
# outlive the process group. Every process whose command line names this DC's smb.conf is
# ours (the path holds the unique state dir).
for p in /proc/[0-9]*; do
  if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$conf"; then
    kill -KILL "${p#/proc/}" 2>/dev/null || true
  fi
done
