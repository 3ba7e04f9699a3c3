"""Peer for `cargo bench -p airlock-acl --bench acl -- recompute memory`: the same layouts
with pyroaring (CRoaring's C implementation, `BitMap.union(*groups)` = roaring_bitmap_or_many).

Run: python3 acl/benches/peer_pyroaring.py   (needs numpy and pyroaring)
"""
import array
import statistics
import time

import numpy as np
from pyroaring import BitMap

TEN_M = 10_000_000


def bm(values):
    return BitMap(array.array("I", np.asarray(values, dtype=np.uint32).tobytes()))


def timed(f, runs=15):
    ts = []
    out = None
    for _ in range(runs):
        t = time.perf_counter()
        out = f()
        ts.append(time.perf_counter() - t)
    return out, ts


def main():
    rng = np.random.default_rng(1)
    docs = np.arange(TEN_M, dtype=np.uint32)
    dept = rng.integers(0, 10, TEN_M)
    proj_mask = rng.random(TEN_M) < 0.2
    proj = rng.integers(0, 50, TEN_M)
    depts = [bm(docs[dept == i]) for i in range(10)]
    projects = [bm(docs[proj_mask & (proj == i)]) for i in range(5)]
    groups = depts + projects
    clustered = [BitMap(range(i * 1_000_000, (i + 1) * 1_000_000)) for i in range(10)]
    print("## recompute (pyroaring %s)" % __import__("pyroaring").__version__)
    for name, gs in [("random (15 groups)", groups), ("clustered (10 groups)", clustered)]:
        out, ts = timed(lambda: BitMap.union(*gs))
        print(
            f"{name}: union of {len(out)} documents: median {statistics.median(ts) * 1e3:.1f} ms, "
            f"min {min(ts) * 1e3:.1f} ms, max {max(ts) * 1e3:.1f} ms (15 runs)"
        )
    print("## memory")
    for pct in (1, 10, 50):
        r = bm(docs[rng.random(TEN_M) < pct / 100])
        c = BitMap(range(0, len(r)))
        size = len(r.serialize())
        c_plain = len(c.serialize())
        c.run_optimize()
        print(
            f"{pct}%: {len(r)} docs; random: {size / 1048576:.2f} MiB ({size / len(r):.2f} bytes/doc); "
            f"clustered: {c_plain / 1048576:.2f} MiB; clustered run-optimized: {len(c.serialize())} bytes"
        )


if __name__ == "__main__":
    main()
