#!/usr/bin/env bash
# The README's main command: a working Airlock on this machine in one step.
#
#   ./scripts/demo.sh [airlock demo flags, e.g. --port 8080 --setup-only]
#
# Fetches the pinned models (digests checked), builds the appliance, then `airlock demo`:
# a demo signing key and keyring, the demo bundle built + signed + installed, bank-dev and
# Cranfield ingested with their permissions, demo users with tokens in
# $AIRLOCK_DATA/demo/tokens.json, and the chat UI served. Re-running is safe and fast.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export AIRLOCK_DATA="${AIRLOCK_DATA:-$ROOT/airlock-data}"
SAMPLE="${AIRLOCK_SAMPLE_DATA:-$ROOT/../shared/datasets}"

echo "==> fetching and staging the pinned models"
bash scripts/fetch-models.sh "$ROOT/models-cache"
echo "==> building airlock (release)"
cargo build --release -p airlock --bin airlock
exec "$ROOT/target/release/airlock" demo --data "$AIRLOCK_DATA" \
  --staging "$ROOT/models-cache/staging" --sample-data "$SAMPLE" "$@"
