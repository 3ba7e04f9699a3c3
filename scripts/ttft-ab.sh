#!/usr/bin/env bash
# Time to first token of two or more builds of the generation bench, alternating, on the same
# box (the box's speed drifts between runs, so only neighbours are compared), optionally with
# llama.cpp (llama-cpp-python) in each round.
#
#   cargo bench -p airlock-inference --bench generate --no-run   # at each commit; copy the
#   cp target/release/deps/generate-<hash> /tmp/bench-a            # printed executable aside
#   PEER=1 scripts/ttft-ab.sh 3 /tmp/bench-a /tmp/bench-b
#
# Env: MODEL (qwen | smollm2, default qwen), TIER (the kernel tier, default avx512), PEER (1 =
# also llama.cpp), AIRLOCK_MODELS_DIR (default ./models-cache/models). Each line: the round,
# the binary, its TTFT of a 450-token prompt in one chunk and with the first 150 cached (ms,
# wall, median of 3 after a warm-up); llama.cpp: three 450-token prefills (ms).
# Keep the binaries apart: two worktrees sharing one CARGO_TARGET_DIR can leave one's
# executable in place of the other's (same unit name); check `md5sum` of the copies.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export AIRLOCK_MODELS_DIR="${AIRLOCK_MODELS_DIR:-$ROOT/models-cache/models}"
export RAYON_NUM_THREADS=2 AIRLOCK_KERNEL_TIER="${TIER:-avx512}"
MODEL="${MODEL:-qwen}"
n=$1; shift
grep -m1 'model name' /proc/cpuinfo
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx_vnni)$' | tr '\n' ' '; echo
for i in $(seq "$n"); do
  for b in "$@"; do
    r=$(AIRLOCK_BENCH_MODELS=$MODEL AIRLOCK_BENCH_PP=450 AIRLOCK_BENCH_PREFIX=150 AIRLOCK_BENCH_TG=1 \
      AIRLOCK_BENCH_REPS=3 AIRLOCK_BENCH_STREAMS= "$b" --bench 2>&1 \
      | grep "time to first" \
      | sed -E 's/.*one prefill chunk\): ([0-9]+) ms.*/full \1/; s/.*cached\): ([0-9]+) ms.*/cached \1/' \
      | tr '\n' ' ')
    echo "$i $(basename "$b"): $r"
  done
  if [ -n "${PEER:-}" ]; then
    printf '%s llama.cpp: ' "$i"
    OMP_WAIT_POLICY=PASSIVE python3 - "$AIRLOCK_MODELS_DIR/$MODEL/model.gguf" <<'PY'
import sys, time, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=2048, n_threads=2, n_batch=512, verbose=False)
toks = [(i * 7919) % 20000 + 100 for i in range(450)]
out = []
for r in range(4):
    llm.reset(); t = time.perf_counter(); llm.eval(toks); ms = (time.perf_counter() - t) * 1e3
    if r: out.append(f"{ms:.0f}")
print("pp450 " + " ".join(out) + " ms")
PY
  fi
done
