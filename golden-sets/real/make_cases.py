#!/usr/bin/env python3
"""Writes SET/dev/golden.jsonl and SET/test/golden.jsonl from SET/questions.py.

    python3 golden-sets/real/make_cases.py SET

questions.py lists the hand-written cases with four helpers (A: answerable, T: two_document,
D: acl_denied, U: unanswerable). Ids are `<prefix>-NNN` in file order; within each kind the
cases alternate dev, test, dev, ... so both splits cover every kind about equally.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ALL = ["v1", "v2", "after_delete"]
CASES = []


def _case(kind, user, query, rel, ans, fdocs, fstr, note=None):
    c = {"user": user, "query": query, "relevant_doc_ids": rel, "answer_contains": ans,
         "forbidden_doc_ids": fdocs, "forbidden_strings": fstr, "phase": "v1", "kind": kind,
         "valid_phases": ALL}
    if note:
        c["note"] = note
    CASES.append(c)


def A(user, query, docs, answers):
    _case("answerable", user, query, docs, answers, [], [])


def T(user, query, docs, answers):
    _case("two_document", user, query, docs, answers, [], [])


def D(user, query, docs, forbidden):
    _case("acl_denied", user, query, [], [], docs, forbidden,
          "the answer is only on pages of a group the user is not in")


def U(user, query, absent):
    _case("unanswerable", user, query, [], [], [], [], "absent: " + absent)


def main():
    name = sys.argv[1]
    d = os.path.join(HERE, name)
    src = open(os.path.join(d, "questions.py")).read()
    ns = {"A": A, "T": T, "D": D, "U": U}
    exec(compile(src, "questions.py", "exec"), ns)
    prefix = ns["PREFIX"]
    seen = {}
    out = {"dev": [], "test": []}
    for i, c in enumerate(CASES, 1):
        k = seen.get(c["kind"], 0)
        seen[c["kind"]] = k + 1
        c = {"id": f"{prefix}-{i:03}", **c}
        out["dev" if k % 2 == 0 else "test"].append(c)
    for split, cases in out.items():
        sd = os.path.join(d, split)
        os.makedirs(sd, exist_ok=True)
        with open(os.path.join(sd, "golden.jsonl"), "w") as f:
            for c in cases:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        for other in ("docs", "corpus.jsonl", "iam_v1.jsonl", "iam_v2.jsonl", "deletions.json"):
            link = os.path.join(sd, other)
            if not os.path.lexists(link):
                os.symlink(os.path.join("..", other), link)
    for other, text in (("corpus.jsonl", ""), ("deletions.json", "[]\n")):
        with open(os.path.join(d, other), "w") as f:
            f.write(text)
    print(f"{name}: {len(CASES)} cases: dev {len(out['dev'])}, test {len(out['test'])}; "
          + ", ".join(f"{k} {v}" for k, v in seen.items()))


if __name__ == "__main__":
    main()
