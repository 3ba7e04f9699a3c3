#!/usr/bin/env python3
"""hnswlib on the SAME vectors as the Rust vector benchmark (side by side, one run).

Called by `cargo bench -p airlock-retrieval --bench vector_build`, which writes raw little-endian
f32 vectors/queries and u32 ground truth (exact top-10) under target/vector-bench/ and passes the
paths. Parameters as in shared/peers/bench_ann.py: space=ip, M=16, ef_construction=200,
random_seed=100; build with --threads threads (2), search with one thread, all queries in one
call; recall@10 = |approx ∩ exact| / 10. Prints one JSON object on stdout.
Needs: pip install numpy hnswlib"""
import argparse, json, os, time
import numpy as np
import hnswlib

p = argparse.ArgumentParser()
p.add_argument("--vectors", required=True)
p.add_argument("--queries", required=True)
p.add_argument("--truth", required=True)
p.add_argument("--dim", type=int, default=384)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--efs", default="16,32,64,128,256,512")
a = p.parse_args()

X = np.fromfile(a.vectors, dtype="<f4").reshape(-1, a.dim)
Q = np.fromfile(a.queries, dtype="<f4").reshape(-1, a.dim)
GT = np.fromfile(a.truth, dtype="<u4").reshape(len(Q), -1)
K = GT.shape[1]

def recall(I):
    return float(np.mean([len(set(x[:K]) & set(g[:K])) / K for x, g in zip(I, GT)]))

t0 = time.perf_counter()
idx = hnswlib.Index(space="ip", dim=a.dim)
idx.init_index(max_elements=len(X), ef_construction=200, M=16, random_seed=100)
idx.add_items(X, np.arange(len(X)), num_threads=a.threads)
build = time.perf_counter() - t0
rows = []
for ef in [int(e) for e in a.efs.split(",")]:
    idx.set_ef(ef)
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        I, _ = idx.knn_query(Q, k=K, num_threads=1)
        ts.append(time.perf_counter() - t0)
    t = sorted(ts)[1]
    rows.append({"ef": ef, "recall": round(recall(I), 4), "qps": round(len(Q) / t, 1),
                 "mean_ms": round(t / len(Q) * 1e3, 4)})
print(json.dumps({"peer": "hnswlib " + getattr(hnswlib, "__version__", "?"), "n": len(X),
                  "build_s": round(build, 2), "inserts_per_s": round(len(X) / build, 1),
                  "threads": a.threads, "rows": rows, "load": os.getloadavg()}))
