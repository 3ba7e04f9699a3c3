#!/usr/bin/env bash
# The README's main command: a working Airlock on this machine in one step.
#
#   ./scripts/demo.sh [--rack] [airlock demo flags, e.g. --port 8080 --setup-only]
#
# Fetches the pinned models (digests checked), builds the appliance, then `airlock demo`:
# a demo signing key and keyring, the demo bundle built + signed + installed, the sample corpus
# ingested with its permissions, three generated files (PDF, XLSX, DOCX) ingested as files, demo
# users with tokens in $AIRLOCK_DATA/demo/tokens.json, and the chat UI served.
# Re-running is safe and fast.
#
# The sample corpus: bank-dev and Cranfield from $AIRLOCK_SAMPLE_DATA (default
# ../shared/datasets) when that folder exists; otherwise (a fresh clone) the repository's own
# real documents, golden-sets/real/systemd-openssh and debian-handbook (man pages and handbook
# chapters as HTML and PDF, each page granted to its chapter's group), with users u01..u07 from
# the sets' iam_v1.jsonl ($AIRLOCK_REPO_CORPUS: other sets, comma-separated).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export AIRLOCK_DATA="${AIRLOCK_DATA:-$ROOT/airlock-data}"
SAMPLE="${AIRLOCK_SAMPLE_DATA:-$ROOT/../shared/datasets}"
REPO_CORPUS="${AIRLOCK_REPO_CORPUS:-$ROOT/golden-sets/real/systemd-openssh,$ROOT/golden-sets/real/debian-handbook}"
# The models cache (fetched, verified and staged here): AIRLOCK_MODELS_CACHE to use another one.
CACHE="${AIRLOCK_MODELS_CACHE:-$ROOT/models-cache}"


# --rack: also start a local llama.cpp server (llama-cpp-python[server], docs/operations/rack.md)
# serving the demo's SmolLM2 as the bank's "inference rack", offered to clients as
# the model `airlock-rack` (citations, ACL and the ladder unchanged). It stops with this script.
RACK=0
ARGS=()
for a in "$@"; do
  if [ "$a" = "--rack" ]; then RACK=1; else ARGS+=("$a"); fi
done

# The binary: the `demo` profile (Cargo.toml: release code generation for the per-chunk and
# per-token crates, half the build time on 2 cores; docs/operations/release-bundle.md), target/demo/airlock.
BIN="$ROOT/target/demo/airlock"
echo "==> fetching the pinned models (in the background) and building airlock (profile demo)"
mkdir -p "$CACHE"
bash scripts/fetch-models.sh --download-only "$CACHE" >"$CACHE/fetch.log" 2>&1 &
FETCH_PID=$!
cargo build --profile demo -p airlock --bin airlock
wait "$FETCH_PID" || { cat "$CACHE/fetch.log"; exit 1; }
echo "==> staging the models (airlock bundle stage --demo)"
AIRLOCK_BIN="$BIN" bash scripts/fetch-models.sh "$CACHE"
if [ "$RACK" = 1 ]; then
  RACK_PORT="${AIRLOCK_RACK_PORT:-8765}"
  mkdir -p "$AIRLOCK_DATA"
  echo "==> starting the rack: llama_cpp.server on 127.0.0.1:$RACK_PORT (log $AIRLOCK_DATA/rack.log)"
  python3 -m llama_cpp.server --model "$CACHE/models/smollm2/model.gguf" \
    --model_alias smollm2-rack --host 127.0.0.1 --port "$RACK_PORT" --n_ctx 2048 \
    --logits_all false --interrupt_requests false --verbose false >"$AIRLOCK_DATA/rack.log" 2>&1 &
  RACK_PID=$!
  trap 'kill "$RACK_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$RACK_PORT/v1/models" >/dev/null 2>&1 && break
    kill -0 "$RACK_PID" 2>/dev/null || { cat "$AIRLOCK_DATA/rack.log"; exit 1; }
    sleep 1
  done
  printf '%s\n' '[[remote_generators]]' 'alias = "airlock-rack"' 'kind = "openai-compatible"' \
    "base_urls = [\"http://127.0.0.1:$RACK_PORT/v1\"]" 'model = "smollm2-rack"' \
    'max_inflight_per_replica = 1' 'fallback_to_local = true' >"$AIRLOCK_DATA/rack.toml"
  export AIRLOCK_CONFIG="$AIRLOCK_DATA/rack.toml"
  # Not exec: the trap stops the rack when the daemon exits.
  "$BIN" demo --data "$AIRLOCK_DATA" \
    --staging "$CACHE/staging" --sample-data "$SAMPLE" --repo-corpus "$REPO_CORPUS" \
    --sample-files "$ROOT/extract/tests/fixtures" "${ARGS[@]}"
  exit $?
fi
exec "$BIN" demo --data "$AIRLOCK_DATA" \
  --staging "$CACHE/staging" --sample-data "$SAMPLE" --repo-corpus "$REPO_CORPUS" \
  --sample-files "$ROOT/extract/tests/fixtures" "${ARGS[@]}"
