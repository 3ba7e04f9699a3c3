#!/usr/bin/env python3
"""Sets for the extraction measurements of docs/benchmarks/extraction.md.

    # 1. the bank-dev set with its doc ids mapped to the converted files' ids
    /tmp/docvenv/bin/python scripts/gen-doc-fixtures.py --convert-corpus /tmp/mixed
    python3 scripts/extraction-eval.py map-set --converted /tmp/mixed --out /tmp/bank-dev-mixed

    # 1b. a smaller copy of the set (every document a case names, plus every k-th other one),
    #     and the converted files of just those documents
    python3 scripts/extraction-eval.py subset --docs 1000 --converted /tmp/mixed \
        --out /tmp/bank-dev-1000 --out-files /tmp/mixed-1000

    # 1c. the answer-hit sample: every 6th `answerable` case of a set, follow-ups left out
    python3 scripts/extraction-eval.py answer-sample --set /tmp/bank-dev-1000 --every 6 \
        --out /tmp/bank-dev-1000-answers

    # 2. the table-question slice: table documents as files + a bank-layout golden set
    /tmp/docvenv/bin/python scripts/extraction-eval.py table-set --out /tmp/tables [--n 40]

`airlock ingest DIR` gives a file its path relative to DIR as document id (`doc-00001.pdf`),
while the golden set and the IAM snapshots name `doc-00001`. `map-set` writes a copy of the set
(golden.jsonl, followups.jsonl, iam_v1/v2.jsonl, deletions.json, corpus.jsonl,
changes_v1_to_v2.json) with every id that the conversion's `.manifest.jsonl` lists replaced by
its file name; nothing else changes.

`subset` keeps every document a case or follow-up names (relevant or forbidden) and every
deleted one, then every k-th other document in corpus order up to `--docs`; it writes the set
(corpus and IAM document lines filtered, cases unchanged, so every case keeps its documents) and
hard-links those documents' converted files into `--out-files`. Retrieval over fewer
distractors scores higher than over the whole corpus; mixed and text runs on the same subset
compare like with like.

`answer-sample` copies a set with `golden.jsonl` cut to every k-th case of one kind (in file
order, so the same cases for a set and its mapped copy) and no `followups.jsonl`: answers are
slow on 2 cores, and this scores answer hit on a deterministic subset.

`table-set` picks corpus documents whose text holds a table of at least 3 columns and 3 data
rows (deterministically, see below), writes each as a file (even
positions XLSX, odd positions PDF, by gen-doc-fixtures.py's writers) into OUT/files/, and one
question per document about one cell: "What is the <column> for <row label> in <title>?",
where the row label is unique in the first column and the answer cell is unique in the table.
Documents are taken round robin over the distinct header rows (first appearance order), so
version-history tables do not crowd out rate, limit and retention tables.
The golden set (OUT/set/) has one user `t001` in `all-staff`, every document granted to
`all-staff`, kind `table`; the ids are the file names.
"""

import argparse
import json
import os
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SET = os.path.join(ROOT, "..", "shared", "datasets", "bank-dev")
SET_FILES = ["golden.jsonl", "followups.jsonl", "iam_v1.jsonl", "iam_v2.jsonl",
             "deletions.json", "corpus.jsonl", "changes_v1_to_v2.json"]


def map_set(set_dir, converted, out):
    ids = {}
    with open(os.path.join(converted, ".manifest.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            ids[m["doc_id"]] = m["file"]
    os.makedirs(out, exist_ok=True)
    pat = re.compile(r"\bdoc-\d{5}\b")
    for name in SET_FILES:
        src = os.path.join(set_dir, name)
        if not os.path.exists(src):
            continue
        with open(src) as f:
            text = f.read()
        text = pat.sub(lambda m: ids.get(m.group(0), m.group(0)), text)
        with open(os.path.join(out, name), "w") as f:
            f.write(text)
    print(f"{len(ids)} ids mapped into {out}")


def subset(set_dir, docs, converted, out, out_files):
    def jsonl(name):
        path = os.path.join(set_dir, name)
        if not os.path.exists(path):
            return []
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]

    corpus = jsonl("corpus.jsonl")
    keep = set()
    for c in jsonl("golden.jsonl") + jsonl("followups.jsonl"):
        keep |= set(c["relevant_doc_ids"]) | set(c["forbidden_doc_ids"])
    with open(os.path.join(set_dir, "deletions.json")) as f:
        keep |= set(json.load(f))
    rest = [d["doc_id"] for d in corpus if d["doc_id"] not in keep]
    extra = max(0, docs - len(keep))
    if extra:
        step = max(1, len(rest) // extra)
        keep |= set(rest[::step][:extra])
    os.makedirs(out, exist_ok=True)
    for name in SET_FILES:
        src = os.path.join(set_dir, name)
        if not os.path.exists(src):
            continue
        with open(src) as f:
            lines = f.readlines()
        if name in ("corpus.jsonl", "iam_v1.jsonl", "iam_v2.jsonl"):
            key = "doc_id" if name == "corpus.jsonl" else "doc"
            lines = [l for l in lines if l.strip() and
                     (key not in json.loads(l) or json.loads(l)[key] in keep)]
        with open(os.path.join(out, name), "w") as f:
            f.writelines(lines)
    if converted:
        with open(os.path.join(converted, ".manifest.jsonl")) as f:
            manifest = [json.loads(l) for l in f]
        os.makedirs(out_files, exist_ok=True)
        with open(os.path.join(out_files, ".manifest.jsonl"), "w") as f:
            for m in manifest:
                if m["doc_id"] in keep:
                    os.link(os.path.join(converted, m["file"]), os.path.join(out_files, m["file"]))
                    f.write(json.dumps(m) + "\n")
    print(f"{len(keep)} of {len(corpus)} documents kept in {out}")


def answer_sample(set_dir, every, kind, out, offset=0):
    os.makedirs(out, exist_ok=True)
    for name in SET_FILES:
        src = os.path.join(set_dir, name)
        if name == "followups.jsonl" or not os.path.exists(src):
            continue
        with open(src) as f:
            lines = f.readlines()
        if name == "golden.jsonl":
            lines = [l for l in lines if l.strip() and json.loads(l)["kind"] == kind][offset::every]
            n = len(lines)
        with open(os.path.join(out, name), "w") as f:
            f.writelines(lines)
    print(f"{n} {kind} cases in {out}")


def load_fixture_writers():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "gen_doc_fixtures", os.path.join(ROOT, "scripts", "gen-doc-fixtures.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def question_of(doc, table):
    """One (question, answer) about a cell of `table`, or None when no cell qualifies."""
    header, rows = table[0], table[1:]
    labels = [r[0] for r in rows]
    cells = [c for r in table for c in r]
    # A middle row and the last column first: deterministic, and not always the first cell.
    order = sorted(range(len(rows)), key=lambda i: abs(i - len(rows) // 2))
    for i in order:
        row = rows[i]
        if len(row) != len(header) or not row[0] or labels.count(row[0]) != 1:
            continue
        for j in range(len(header) - 1, 0, -1):
            cell = row[j]
            if cell and header[j] and cells.count(cell) == 1 and len(cell) <= 40:
                q = f"What is the {header[j]} for {row[0]} in {doc['title']}?"
                return q, cell
    return None


def table_set(corpus_path, out, n):
    g = load_fixture_writers()
    corpus = g.load_corpus(corpus_path)
    eligible = []
    for doc in corpus:
        for kind, val in g.blocks_of(doc["text"]):
            if kind == "table" and len(val) >= 4 and len(val[0]) >= 3:
                qa = question_of(doc, val)
                if qa:
                    eligible.append((doc, qa, tuple(val[0])))
                    break
    # Round robin over the tables' header rows (in order of first appearance), so the many
    # version-history tables do not crowd out rate, limit and retention tables.
    by_header = {}
    for doc, qa, header in eligible:
        by_header.setdefault(header, []).append((doc, qa))
    chosen, depth = [], 0
    while len(chosen) < n and any(len(v) > depth for v in by_header.values()):
        for v in by_header.values():
            if depth < len(v) and len(chosen) < n:
                chosen.append(v[depth])
        depth += 1
    chosen.sort(key=lambda c: c[0]["doc_id"])
    files = os.path.join(out, "files")
    set_dir = os.path.join(out, "set")
    for d in (files, set_dir):
        if os.path.exists(d):
            shutil.rmtree(d)
        os.makedirs(d)
    cases, iam, corpus_lines = [], [{"user": "t001", "groups": ["all-staff"]}], []
    for i, (doc, (q, a)) in enumerate(chosen):
        ext = "xlsx" if i % 2 == 0 else "pdf"
        name = f"{doc['doc_id']}.{ext}"
        path = os.path.join(files, name)
        if ext == "xlsx":
            g.xlsx_from_doc(path, doc)
        else:
            g.pdf_from_doc_platypus(path, doc)
        iam.append({"doc": name, "users": [], "groups": ["all-staff"]})
        corpus_lines.append({"doc_id": name, "title": doc["title"], "text": doc["text"],
                             "metadata": doc["metadata"]})
        cases.append({"id": f"tq-{i + 1:03d}", "user": "t001", "query": q,
                      "relevant_doc_ids": [name], "answer_contains": [a],
                      "forbidden_doc_ids": [], "forbidden_strings": [], "phase": "v1",
                      "kind": "table", "valid_phases": ["v1", "v2", "after_delete"]})

    def jsonl(name, rows):
        with open(os.path.join(set_dir, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    jsonl("golden.jsonl", cases)
    jsonl("iam_v1.jsonl", iam)
    jsonl("iam_v2.jsonl", iam)
    jsonl("corpus.jsonl", corpus_lines)
    with open(os.path.join(set_dir, "deletions.json"), "w") as f:
        f.write("[]\n")
    print(f"{len(eligible)} documents with a qualifying table; {len(cases)} questions "
          f"({sum(1 for c in cases if c['relevant_doc_ids'][0].endswith('.xlsx'))} XLSX, "
          f"{sum(1 for c in cases if c['relevant_doc_ids'][0].endswith('.pdf'))} PDF) in {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("map-set")
    m.add_argument("--set", default=DEFAULT_SET)
    m.add_argument("--converted", required=True)
    m.add_argument("--out", required=True)
    b = sub.add_parser("subset")
    b.add_argument("--set", default=DEFAULT_SET)
    b.add_argument("--docs", type=int, required=True)
    b.add_argument("--converted")
    b.add_argument("--out", required=True)
    b.add_argument("--out-files")
    w = sub.add_parser("answer-sample")
    w.add_argument("--set", required=True)
    w.add_argument("--every", type=int, required=True)
    w.add_argument("--kind", default="answerable")
    w.add_argument("--offset", type=int, default=0,
                   help="first case taken (0-based); --every 2 with --offset 0 and 1 splits a set in two")
    w.add_argument("--out", required=True)
    t = sub.add_parser("table-set")
    t.add_argument("--corpus", default=os.path.join(DEFAULT_SET, "corpus.jsonl"))
    t.add_argument("--out", required=True)
    t.add_argument("--n", type=int, default=40)
    a = ap.parse_args()
    if a.cmd == "map-set":
        map_set(a.set, a.converted, a.out)
    elif a.cmd == "answer-sample":
        answer_sample(a.set, a.every, a.kind, a.out, a.offset)
    elif a.cmd == "subset":
        subset(a.set, a.docs, a.converted, a.out, a.out_files)
    else:
        table_set(a.corpus, a.out, a.n)


if __name__ == "__main__":
    sys.exit(main())
