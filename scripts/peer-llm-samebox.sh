#!/usr/bin/env bash
# Same-box, back-to-back comparison of our generator with the peer (llama.cpp through
# llama-cpp-python), as in docs/benchmarks/inference-generate.md ("Method", "Same-box comparison with llama.cpp").
#
#   scripts/peer-llm-samebox.sh [setup|single|batched|all]   (default: all)
#
# setup    copies ../shared/peers/{common,bench_llm,bench_llm_batched}.py to $OUT/peer with these
#          additions only: PEER_PP / PEER_TG (prompt and decode tokens, default 512 / 128),
#          PEER_PREFIX (> 0: also the time to first token with the KV of the prompt's first
#          PEER_PREFIX tokens kept, as llama-server's prompt cache keeps a shared prefix),
#          time.process_time() around the timed regions (per CPU-second rates = tokens / (CPU-s / 2
#          threads), as our bench computes them), PEER_S (stream counts, default 1,2,4), PEER_RUNS
#          (timed runs, default 3) and 16 distinct prompts instead of 4; logs
#          llama_print_system_info() (whether the peer was built with AVX-512 / VNNI).
# single   per model in $MODELS_LIST (default "qwen smollm2"): peer, then ours per tier in
#          $TIERS (default "avx2 avx512": AIRLOCK_KERNEL_TIER), back to back; PP=450 prompt tokens
#          (the RAG prompt), PREFIX=150 (the fixed system prompt), TG=128 decode steps.
# batched  per model: peer with 1, 4, 8 sequences; ours (AIRLOCK_BENCH_BATCHED, the same shape:
#          128-token prompts, 128 greedy steps, decode time only) per tier.
#
# $PEER_PY: the Python with llama_cpp (default python3). OMP_WAIT_POLICY=PASSIVE is set for the
# peer (its OpenMP threads sleep at barriers like our rayon pool; spinning collapses on a shared
# box). Both sides 2 threads. Logs: $OUT/logs/ (default /tmp/llm-samebox); `uptime` before each run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${AIRLOCK_SHARED_DIR:-$ROOT/../shared}"
OUT="${OUT:-/tmp/llm-samebox}"
PEER_PY="${PEER_PY:-python3}"
MODELS_DIR="${AIRLOCK_MODELS_DIR:-$ROOT/models-cache/models}"
MODELS_LIST="${MODELS_LIST:-qwen smollm2}"
TIERS="${TIERS:-avx2 avx512}"
PP="${PP:-450}" PREFIX="${PREFIX:-150}" TG="${TG:-128}" REPS="${REPS:-3}"
STREAMS="${STREAMS:-1,4,8}"
TAG="${TAG:-}"
export PEER_WORK="$OUT/peer-work" PEER_DATA="$SHARED/datasets"
mkdir -p "$OUT/logs" "$OUT/peer"

setup() {
  cp "$SHARED/peers/common.py" "$SHARED/peers/bench_llm.py" "$SHARED/peers/bench_llm_batched.py" "$OUT/peer/"
  chmod u+w "$OUT/peer/"*.py
  python3 - "$OUT/peer" <<'EOF'
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
 'DATA = os.environ.get("PEER_DATA", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "datasets"))')])
patch("bench_llm.py", [
 ('PP, TG = 512, 128',
  '# same-box run: sizes from the environment; PREFIX > 0 also times the first token with the\n'
  '# KV of the first PREFIX prompt tokens kept (n_tokens rewound, the rest evaluated)\n'
  'PP, TG = int(os.environ.get("PEER_PP", 512)), int(os.environ.get("PEER_TG", 128))\n'
  'PREFIX = int(os.environ.get("PEER_PREFIX", 0))'),
 ('        t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter()\n',
  '        c0 = time.process_time()\n'
  '        t0 = time.perf_counter(); llm.eval(toks); t1 = time.perf_counter()\n'
  '        c1 = time.process_time()\n'),
 ('        t2 = time.perf_counter()\n',
  '        t2 = time.perf_counter(); c2 = time.process_time()\n'),
 ('        return t1 - t0, t2 - t1, (p.t_p_eval_ms, p.n_p_eval, p.t_eval_ms, p.n_eval)\n',
  '        return t1 - t0, t2 - t1, (p.t_p_eval_ms, p.n_p_eval, p.t_eval_ms, p.n_eval), c1 - c0, c2 - c1\n'),
 ('        la = load_avg(); pp, tg, perf = one()\n        runs.append((pp, tg, perf))\n',
  '        la = load_avg(); pp, tg, perf, cpp, ctg = one()\n        runs.append((pp, tg, perf, cpp, ctg))\n'),
 ('           "llama_cpp_python": llama_cpp.__version__, "n_threads": 2}\n',
  '           "llama_cpp_python": llama_cpp.__version__, "n_threads": 2}\n'
  '    cpp = statistics.median(x[3] for x in runs); ctg = statistics.median(x[4] for x in runs)\n'
  '    out["pp_tok_per_cpu_s"] = round(PP / (cpp / 2), 1); out["tg_tok_per_cpu_s"] = round(TG / (ctg / 2), 1)\n'
  '    out["ttft_ms"] = round(pp * 1e3); out["ttft_ms_per_cpu"] = round(cpp / 2 * 1e3)\n'
  '    if 0 < PREFIX < PP:\n'
  '        llm.reset(); llm.eval(toks[:PREFIX])\n'
  '        tt, tc = [], []\n'
  '        for r in range(4):\n'
  '            llm.n_tokens = PREFIX\n'
  '            c0 = time.process_time(); t0 = time.perf_counter()\n'
  '            llm.eval(toks[PREFIX:]); int(np.argmax(last_logits(llm)))\n'
  '            if r: tt.append(time.perf_counter() - t0); tc.append(time.process_time() - c0)\n'
  '        out["prefix_tokens"] = PREFIX; out["ttft_prefix_ms"] = round(statistics.median(tt) * 1e3)\n'
  '        out["ttft_prefix_ms_per_cpu"] = round(statistics.median(tc) / 2 * 1e3)\n'
  '    out["system_info"] = llama_cpp.llama_print_system_info().decode()\n'),
])
patch("bench_llm_batched.py", [
 ('    prompts = [tok(docs[100 + i]["text"])[:PL] for i in range(4)]\n',
  '    prompts = [tok(docs[100 + i]["text"])[:PL] for i in range(16)]\n'
  '    assert all(len(p) == PL for p in prompts)\n'),
 ('    for S in (1, 2, 4):\n',
  '    for S in [int(x) for x in os.environ.get("PEER_S", "1,2,4").split(",")]:\n'),
 ('            t2 = time.perf_counter()\n            return t1 - t0, t2 - t1\n',
  '            t2 = time.perf_counter(); c2 = time.process_time()\n            return t1 - t0, t2 - t1, c2 - c1\n'),
 ('            t1 = time.perf_counter()\n',
  '            t1 = time.perf_counter(); c1 = time.process_time()\n'),
 ('        runs = [once() for _ in range(3)]\n',
  '        runs = [once() for _ in range(int(os.environ.get("PEER_RUNS", 3)))]\n'
  '        ctg = statistics.median(r[2] for r in runs)\n'),
 ('"per_stream_decode_tok_s": round(TG / tg, 1),',
  '"per_stream_decode_tok_s": round(TG / tg, 1), "agg_decode_tok_per_cpu_s": round(S * TG / (ctg / 2), 1),'),
])
EOF
  "$PEER_PY" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__, llama_cpp.__file__); print(llama_cpp.llama_print_system_info().decode())' \
    | tee "$OUT/logs/peer-system-info.txt"
  (cd "$ROOT" && nice -n 10 cargo bench -q -p airlock-inference --bench generate --no-run)
}

stamp() { echo "== $1 $(date -u +%H:%M:%S) $(uptime)"; grep -m1 'model name' /proc/cpuinfo; }

peer() { # peer LOG SCRIPT ARGS...
  local log=$1; shift
  stamp "peer $*" | tee -a "$log"
  (cd "$OUT/peer" && OMP_WAIT_POLICY=PASSIVE "$PEER_PY" "$@") >>"$log" 2>&1
}

ours() { # ours LOG TIER ENV...
  local log=$1 tier=$2; shift 2
  stamp "ours $tier $*" | tee -a "$log"
  (cd "$ROOT" && env AIRLOCK_KERNEL_TIER="$tier" RAYON_NUM_THREADS=2 "$@" \
    cargo bench -q -p airlock-inference --bench generate) >>"$log" 2>&1
}

single() {
  for m in $MODELS_LIST; do
    local log="$OUT/logs/single-$m$TAG.txt"
    PEER_PP=$PP PEER_TG=$TG PEER_PREFIX=$PREFIX peer "$log" bench_llm.py "$MODELS_DIR/$m/model.gguf"
    for t in $TIERS; do
      ours "$log" "$t" AIRLOCK_BENCH_MODELS="$m" AIRLOCK_BENCH_PP="$PP" AIRLOCK_BENCH_PREFIX="$PREFIX" \
        AIRLOCK_BENCH_TG="$TG" AIRLOCK_BENCH_REPS="$REPS" AIRLOCK_BENCH_STREAMS=
    done
  done
}

batched() {
  for m in $MODELS_LIST; do
    local log="$OUT/logs/batched-$m$TAG.txt"
    PEER_S=$STREAMS PEER_RUNS=$REPS peer "$log" bench_llm_batched.py "$MODELS_DIR/$m/model.gguf"
    for t in $TIERS; do
      ours "$log" "$t" AIRLOCK_BENCH_MODELS="$m" AIRLOCK_BENCH_PP=16 AIRLOCK_BENCH_TG=1 \
        AIRLOCK_BENCH_REPS="$REPS" AIRLOCK_BENCH_BATCHED="$STREAMS" AIRLOCK_BENCH_STREAMS=
    done
  done
}

case "${1:-all}" in
  setup) setup ;;
  single) single ;;
  batched) batched ;;
  all) setup; single; batched ;;
  *) echo "usage: $0 [setup|single|batched|all]" >&2; exit 2 ;;
esac
grep -h -E '^== |tier:|_median|ttft|time to first|^pp|^tg|batched decode|agg_decode' "$OUT"/logs/*.txt 2>/dev/null | tail -n 120 || true
