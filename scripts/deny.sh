#!/usr/bin/env bash
# Supply-chain policy of the build (deny.toml), with cargo-deny:
#   licences (allow-list), bans (no HTTP/TLS client stacks, no model hubs), duplicate versions
#   (each accepted one is listed in deny.toml with who pulls it), sources (crates.io only);
#   advisories (RustSec) ONLY where a local copy of the advisory database exists: this machine
#   and CI cannot fetch it (it is a git repository, and only package registries are reachable).
#   Put a checkout of the advisory-db repository at
#   $AIRLOCK_ADVISORY_DB/advisory-db-3157b0e258782691 (the directory name cargo-deny derives
#   from the database URL) to have advisories checked, offline, against that snapshot.
set -euo pipefail
cd "$(dirname "$0")/.."
DENY_VERSION=0.20.2
if ! cargo deny --version 2>/dev/null | grep -qx "cargo-deny $DENY_VERSION"; then
  echo "installing cargo-deny $DENY_VERSION from crates.io (compiles for a few minutes, once)"
  # Its release profile is fat LTO with one codegen unit: minutes of single-core linking on CI's
  # 2 cores for a check that runs 1 s. Thin, parallel, -O1 builds it in a fraction of the CPU.
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    CARGO_PROFILE_RELEASE_OPT_LEVEL=1 \
    nice cargo install -q cargo-deny --version "$DENY_VERSION" --locked
fi
# `--install-only`: .ci/run installs it in the background while the workspace builds.
[ "${1:-}" = --install-only ] && exit 0
export AIRLOCK_ADVISORY_DB="${AIRLOCK_ADVISORY_DB:-$HOME/.cargo/advisory-dbs}"
cargo deny --locked check licenses bans sources
db=$(find "$AIRLOCK_ADVISORY_DB" -maxdepth 1 -name 'advisory-db-*' -type d 2>/dev/null | head -n 1 || true)
if [ -n "$db" ] && [ -d "$db/crates" ]; then
  echo "advisories: checking against the local snapshot $db ($(git -C "$db" log -1 --format=%cs 2>/dev/null || echo 'date unknown'))"
  cargo deny --frozen check advisories
else
  echo "SKIPPED: advisories: no RustSec advisory database under $AIRLOCK_ADVISORY_DB (none can be fetched here); licences, bans, duplicates and sources were checked"
fi
