#!/usr/bin/env bash
# Times the README's demo as a newcomer gets it (issue 26 point 9): a clean clone of this
# checkout's HEAD in /tmp/fresh, an empty CARGO_HOME (crates downloaded), an empty target, an
# empty models cache with pip's cache off (wheels downloaded), an empty data dir; then
# `scripts/demo.sh --port 18080` until /readyz, one answer, and the end of the background ingest.
# The corpus is what a newcomer gets: the repository's real documents (golden-sets/real/, no
# sample datasets; the answer asked as u04, who reads the OpenSSH pages); with
# AIRLOCK_SAMPLE_DATA=DIR set, bank-dev and Cranfield from DIR instead (asked as u001).
# Results in $OUT (default /tmp/fresh-demo-timing): info.txt (CPU, load, times), progress.txt.
# Run it on an otherwise idle box.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-/tmp/fresh-demo-timing}"
if [ -n "${AIRLOCK_SAMPLE_DATA:-}" ]; then
  SAMPLE="$(cd "$AIRLOCK_SAMPLE_DATA" && pwd)" || exit 1
  USER_ID=u001 QUESTION="What is the fee in the rate table?"
else
  SAMPLE=/tmp/fresh/no-sample-datasets
  USER_ID=u04 QUESTION="What is the default RSA key size of ssh-keygen?"
fi
rm -rf /tmp/fresh /tmp/fresh-cargo-home "$OUT"; mkdir -p "$OUT"
git clone -q "$ROOT" /tmp/fresh
cd /tmp/fresh
git log -1 --format='commit %H' > "$OUT/info.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' >> "$OUT/info.txt"
grep -o -w -E 'avx2|avx512f|avx512_vnni|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ' >> "$OUT/info.txt"; echo >> "$OUT/info.txt"
uptime >> "$OUT/info.txt"
echo "sample data: $SAMPLE (absent: the repository's real documents)" >> "$OUT/info.txt"
export CARGO_HOME=/tmp/fresh-cargo-home PIP_NO_CACHE_DIR=1 AIRLOCK_SAMPLE_DATA="$SAMPLE"
T0=$(date +%s.%N); echo "start $(date -u +%T)" >> "$OUT/info.txt"
./scripts/demo.sh --port 18080 > "$OUT/demo.log" 2>&1 &
PID=$!
until curl -sf http://127.0.0.1:18080/readyz >/dev/null 2>&1; do
  kill -0 $PID 2>/dev/null || { echo "demo exited" >> "$OUT/info.txt"; exit 1; }
  sleep 1
done
T1=$(date +%s.%N); echo "ready $(date -u +%T) after $(echo "$T1 - $T0" | bc) s" >> "$OUT/info.txt"
uptime >> "$OUT/info.txt"
TOK=$(python3 -c "import json;print(json.load(open('airlock-data/demo/tokens.json'))['$USER_ID'])")
ADM=$(python3 -c "import json;print(json.load(open('airlock-data/demo/tokens.json'))['admin'])")
curl -s http://127.0.0.1:18080/ -o /dev/null -w "chat UI page %{http_code}\n" >> "$OUT/info.txt"
curl -s -H "Authorization: Bearer $TOK" -H 'Content-Type: application/json' \
  -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$QUESTION\"}],\"max_tokens\":64}" \
  http://127.0.0.1:18080/v1/chat/completions -o "$OUT/first-answer.json" -w "first answer %{http_code} in %{time_total} s\n" >> "$OUT/info.txt"
T2=$(date +%s.%N); echo "first answer done $(date -u +%T) after $(echo "$T2 - $T0" | bc) s" >> "$OUT/info.txt"
while :; do
  A=$(curl -s -H "Authorization: Bearer $ADM" http://127.0.0.1:18080/v1/info | python3 -c "import json,sys;i=json.load(sys.stdin)['indexing'];print('idle' if not i or not i.get('active') else '%s %s/%s' % (i['job']['name'], i['job']['docs_done'], i['job']['docs_total']) if i.get('job') else 'queued')")
  echo "$(date -u +%T) $A" >> "$OUT/progress.txt"
  [ "$A" = idle ] && break
  sleep 15
done
T3=$(date +%s.%N); echo "background ingest done $(date -u +%T) after $(echo "$T3 - $T0" | bc) s" >> "$OUT/info.txt"
curl -s -H "Authorization: Bearer $ADM" http://127.0.0.1:18080/v1/info > "$OUT/info-final.json"
kill $PID; sleep 3; pkill -f "airlock serve --data /tmp/fresh" || true
echo "end $(date -u +%T)" >> "$OUT/info.txt"
