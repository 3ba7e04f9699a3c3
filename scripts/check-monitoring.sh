#!/usr/bin/env bash
# Checks the monitoring kit in packaging/ (docs/operations/monitoring.md):
#   - the Prometheus rules with a real promtool (Debian package `prometheus`): `check rules` (syntax,
#     PromQL) and `test rules` (packaging/prometheus/airlock-rules.test.yml: the alerts fire on the
#     daemon's series and stay quiet otherwise);
#   - the Grafana dashboard against Grafana's own dashboard types (@grafana/schema, pinned by
#     tests/monitoring/package-lock.json) with the TypeScript compiler, plus layout rules.
# That every airlock_* name they use is one the daemon exports is a cargo test
# (appliance/tests/integration/monitoring.rs).
#
#   scripts/check-monitoring.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v promtool >/dev/null || { echo "promtool missing: apt-get install prometheus" >&2; exit 1; }
promtool check rules packaging/prometheus/airlock-rules.yml
(cd packaging/prometheus && promtool test rules airlock-rules.test.yml)
[ -d tests/monitoring/node_modules ] || npm ci --prefix tests/monitoring --no-audit --no-fund
node tests/monitoring/check-dashboard.mjs packaging/grafana/airlock.json
