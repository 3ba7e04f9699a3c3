#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets/) for SECONDS each (default 60), starting from
# the checked-in seeds (fuzz/corpus/<target>/) and crash regressions (fuzz/regressions/<target>/).
# New corpus entries go to fuzz/target/corpus/<target>/ (not committed); a crash or a slow input
# (over 10 s) is written to fuzz/artifacts/<target>/ and fails the script: minimise it with
# `cargo fuzz tmin <target> <file>`, commit it under fuzz/regressions/<target>/ (cargo test then
# replays it) and fix the bug. See docs/FUZZING.md.
#
#   scripts/fuzz.sh [SECONDS]            every target but the daemon's (chat_body, rack_*)
#   AIRLOCK_FUZZ_APPLIANCE=1 scripts/fuzz.sh   also chat_body, rack_stream, rack_metrics, answer_receipt, backup_archive, console_report (builds the
#                                        whole daemon instrumented)
#   AIRLOCK_FUZZ_TARGETS="acl_snapshot keyring_json" scripts/fuzz.sh 30
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "=== fuzz: skipped: cargo fuzz not installed (cargo install cargo-fuzz --locked)." >&2
  echo "=== fuzz: the same harnesses still run over the corpus in cargo test." >&2
  exit 0
fi
# cargo fuzz passes nightly-only rustc flags (-Z, sancov passes); the stable toolchain accepts
# them with RUSTC_BOOTSTRAP. No sanitizer: the code under test is safe Rust, and ASan would not
# instrument the C code (zstd, SQLite) that cc builds anyway.
export RUSTC_BOOTSTRAP=1
flags=(--sanitizer none)
targets=${AIRLOCK_FUZZ_TARGETS:-"bundle_verify bundle_payload bundle_manifest keyring_json acl_snapshot golden_jsonl eval_export ingest_html ingest_jsonl ingest_sidecar vector_graph_dump extract_pdf extract_docx extract_xlsx extract_pptx extract_eml extract_csv connectors_security_descriptor"}
if [ "${AIRLOCK_FUZZ_APPLIANCE:-0}" = 1 ]; then
  flags+=(--features appliance)
  for t in chat_body rack_stream rack_metrics answer_receipt backup_archive console_report; do
    case " $targets " in *" $t "*) ;; *) targets="$targets $t" ;; esac
  done
fi

start=$(date +%s)
nice cargo fuzz build "${flags[@]}"
echo "=== fuzz: build took $(( $(date +%s) - start )) s"

failed=0
for t in $targets; do
  work=fuzz/target/corpus/$t
  mkdir -p "$work" "fuzz/artifacts/$t"
  dirs=("$work" "fuzz/corpus/$t")
  if [ -d "fuzz/regressions/$t" ] && [ -n "$(ls -A "fuzz/regressions/$t")" ]; then
    dirs+=("fuzz/regressions/$t")
  fi
  log=fuzz/target/$t.log
  status=ok
  if ! nice cargo fuzz run "${flags[@]}" "$t" "${dirs[@]}" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" >"$log" 2>&1; then
    status=FAILED
    failed=1
  fi
  stat() { grep -o "stat::$1: *[0-9]*" "$log" | grep -o '[0-9]*$' | tail -1; }
  echo "=== fuzz: $t: $status, $(stat number_of_executed_units) executions" \
    "($(stat average_exec_per_sec)/s) in ${secs} s, corpus $(ls "$work" | wc -l) files," \
    "peak RSS $(stat peak_rss_mb) MB"
  if [ "$status" != ok ]; then
    grep -E "panicked at|ERROR: libFuzzer|SUMMARY|Test unit written" "$log" | head -5
    ls -l "fuzz/artifacts/$t/"
  fi
done
exit $failed
