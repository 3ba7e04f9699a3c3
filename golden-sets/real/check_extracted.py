#!/usr/bin/env python3
"""Reports which answer strings the appliance's own extraction keeps (diagnostic, exit 0).

    airlock ingest --data D golden-sets/real/SET/docs
    python3 golden-sets/real/check_extracted.py SET D

Reads the chunks of every page from D/airlock.db (read-only) and, for each answerable and
two_document case, looks for its answer strings (normalised as check.py does) in the relevant
pages' chunk text: in one chunk, or only across the page's chunks joined. Lists the misses per
page format (html, pdf, pdf in two columns), so extraction losses show up by format.
"""
import json
import os
import sqlite3
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from check import SetData, norm_needle, norm_page  # noqa: E402


def main():
    name, data = sys.argv[1], sys.argv[2]
    d = os.path.join(HERE, name)
    made = {}
    with open(os.path.join(d, "pages.tsv")) as f:
        next(f)
        for line in f:
            doc, _, _, how = line.rstrip("\n").split("\t")
            made[doc] = "pdf-2col" if "2 columns" in how else ("pdf" if doc.endswith(".pdf") else "html")
    db = sqlite3.connect(f"file:{os.path.join(data, 'airlock.db')}?mode=ro", uri=True)
    chunks = {}
    for doc, text in db.execute(
            "SELECT d.doc_id, c.text FROM chunks c JOIN documents d ON d.ordinal = c.doc_ordinal "
            "WHERE d.deleted_at IS NULL ORDER BY d.doc_id, c.position"):
        chunks.setdefault(doc, []).append(norm_page(text))
    missing_docs = sorted(set(made) - set(chunks))
    pages = SetData(d)
    stats = {}
    misses = []
    not_ingested = 0
    for split in ("dev", "test"):
        with open(os.path.join(d, split, "golden.jsonl")) as f:
            for line in f:
                c = json.loads(line)
                if c["kind"] not in ("answerable", "two_document"):
                    continue
                for a in c["answer_contains"]:
                    n = norm_needle(a)
                    # The pages whose text (check.py's reading) holds the string: every relevant
                    # page of an answerable case, one of the two of a two_document case.
                    for doc in [x for x in c["relevant_doc_ids"] if n in pages.text(x)]:
                        if doc not in chunks:
                            not_ingested += 1
                            continue
                        cs = chunks[doc]
                        s = stats.setdefault(made[doc], [0, 0, 0])
                        s[0] += 1
                        if any(n in x for x in cs):
                            s[1] += 1
                        elif n in " ".join(cs):
                            s[2] += 1
                        else:
                            misses.append((c["id"], made[doc], doc, a))
    print(f"{name}: {len(chunks)} pages with chunks, {len(missing_docs)} pages without "
          f"(their {not_ingested} answer strings not counted): {missing_docs[:5]}")
    for fmt, (n, one, across) in sorted(stats.items()):
        print(f"  {fmt}: {n} answer strings, {one} in one chunk, {across} only across chunks, "
              f"{n - one - across} missing")
    for m in misses:
        print("  missing:", *m)


if __name__ == "__main__":
    main()
