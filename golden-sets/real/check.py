#!/usr/bin/env python3
"""Checks the real-document sets. Exit 1 on any failure.

    python3 golden-sets/real/check.py [SET ...]          # default: every set folder here
    python3 golden-sets/real/check.py SET --grep TEXT     # which pages hold TEXT (normalised)

Per set: the corpus folder and its grants (docs/.acl.jsonl = the document lines of iam_v1.jsonl
= iam_v2.jsonl), the cases of dev/golden.jsonl and test/golden.jsonl (strict GoldenCase fields),
and per case: users and documents exist; relevant pages are readable by the asker, forbidden
pages are not; every answer string is in the page text (normalised as the eval matches answers:
airlock-text `normalize`, plus whitespace runs as one space); two-document cases need both
pages; forbidden strings are in a forbidden page and in no page the asker may read;
unanswerable cases name terms (`note: "absent: a; b"`) found in no page; no question shares an
8-word run with any page; ids unique across splits; both splits cover every kind.
Page text: pagetext.py (HTMLParser for HTML, pdftotext for PDF).
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pagetext  # noqa: E402

FIELDS_REQUIRED = ["id", "user", "query", "relevant_doc_ids", "answer_contains",
                   "forbidden_doc_ids", "forbidden_strings", "phase", "kind", "valid_phases"]
FIELDS_OPTIONAL = ["history", "note"]
KINDS = {"answerable", "two_document", "acl_denied", "unanswerable"}
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december"]


# --- airlock-text normalize(), ported (text/src/lib.rs) -------------------------------------
def _month(w):
    w = w.rstrip(".")
    if len(w) < 3:
        return None
    for i, m in enumerate(MONTHS):
        if m.startswith(w) and (len(w) == len(m) or len(w) == 3):
            return i + 1
    return None


def _day(t):
    t = t.rstrip(",")
    for suf in ("st", "nd", "rd", "th"):
        if t.endswith(suf):
            t = t[: -len(suf)]
    try:
        d = int(t)
    except ValueError:
        return None
    return d if 1 <= d <= 31 and t.isascii() and t.isdigit() else None


def _year(t):
    m = re.match(r"[0-9]*", t)
    digits = m.group(0)
    if len(digits) != 4:
        return None
    return int(digits), t[4:]


def normalize(text):
    s = []
    for c in text:
        if "\u2010" <= c <= "\u2015" or c == "\u2212":
            c = "-"
        elif c in "\u00a0\u202f\u2009":
            c = " "
        s.append(c.lower())
    lower = "".join(s)
    out = []
    for i, c in enumerate(lower):
        if c in ",'" and 0 < i < len(lower) - 1 and lower[i - 1].isdigit() and lower[i + 1].isdigit() \
                and lower[i - 1].isascii() and lower[i + 1].isascii():
            continue
        out.append(c)
    toks = "".join(out).split(" ")
    res, i = [], 0
    while i < len(toks):
        if i + 2 < len(toks):
            d, m, y = _day(toks[i]), _month(toks[i + 1]), _year(toks[i + 2])
            if d and m and y and not toks[i].endswith(","):
                res.append(f"{y[0]:04}-{m:02}-{d:02}{y[1]}")
                i += 3
                continue
            m, d, y = _month(toks[i]), _day(toks[i + 1]), _year(toks[i + 2])
            if m and d and y:
                res.append(f"{y[0]:04}-{m:02}-{d:02}{y[1]}")
                i += 3
                continue
        res.append(toks[i])
        i += 1
    return " ".join(res)


def norm_page(text):
    return normalize(pagetext.flat(text))


def norm_needle(s):
    return normalize(pagetext.flat(s))


def words(text):
    return [w.lower() for w in re.split(r"[^0-9A-Za-z]+", text) if w]


def ngrams(ws, n=8):
    return {" ".join(ws[i:i + n]) for i in range(len(ws) - n + 1)}


# --- set loading -----------------------------------------------------------------------------
class SetData:
    def __init__(self, d):
        self.dir = d
        self.name = os.path.basename(d.rstrip("/"))
        self.docs_dir = os.path.join(d, "docs")
        self.doc_groups = {}
        self.user_groups = {}
        self.errors = []
        self._text = {}
        self._load_grants()

    def err(self, msg):
        self.errors.append(f"{self.name}: {msg}")

    def _load_grants(self):
        files = []
        for root, dirs, names in os.walk(self.docs_dir):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            for n in sorted(names):
                if not n.startswith("."):
                    files.append(os.path.relpath(os.path.join(root, n), self.docs_dir))
        sidecar = {}
        with open(os.path.join(self.docs_dir, ".acl.jsonl")) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    sidecar[r["path"]] = (tuple(sorted(r["users"])), tuple(sorted(r["groups"])))
        iam = {}
        for v in ("iam_v1.jsonl", "iam_v2.jsonl"):
            with open(os.path.join(self.dir, v)) as f:
                iam[v] = f.read()
        if iam["iam_v1.jsonl"] != iam["iam_v2.jsonl"]:
            self.err("iam_v2.jsonl differs from iam_v1.jsonl (these sets have one IAM state)")
        for line in iam["iam_v1.jsonl"].splitlines():
            r = json.loads(line)
            if "user" in r:
                self.user_groups[r["user"]] = set(r["groups"])
            else:
                g = (tuple(sorted(r["users"])), tuple(sorted(r["groups"])))
                if sidecar.get(r["doc"]) != g:
                    self.err(f"grant of {r['doc']} differs between iam_v1.jsonl and docs/.acl.jsonl")
                if r["users"]:
                    self.err(f"{r['doc']}: grants by user name are not used in these sets")
                self.doc_groups[r["doc"]] = set(r["groups"])
        if sorted(files) != sorted(self.doc_groups) or sorted(sidecar) != sorted(files):
            self.err("files in docs/, grants in iam_v1.jsonl and rules in docs/.acl.jsonl differ")
        with open(os.path.join(self.dir, "deletions.json")) as f:
            if json.load(f) != []:
                self.err("deletions.json is not []")
        if os.path.getsize(os.path.join(self.dir, "corpus.jsonl")) != 0:
            self.err("corpus.jsonl must be empty (the corpus is docs/, ingested as a folder)")

    def text(self, doc):
        if doc not in self._text:
            self._text[doc] = norm_page(pagetext.page_text(os.path.join(self.docs_dir, doc)))
        return self._text[doc]

    def readable(self, user, doc):
        return bool(self.user_groups.get(user, set()) & self.doc_groups[doc])

    def holders(self, needle):
        n = norm_needle(needle)
        return [d for d in sorted(self.doc_groups) if n in self.text(d)]


def load_cases(s, split):
    path = os.path.join(s.dir, split, "golden.jsonl")
    cases = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                c = json.loads(line)
            except json.JSONDecodeError as e:
                s.err(f"{split}/golden.jsonl:{i}: {e}")
                continue
            unknown = set(c) - set(FIELDS_REQUIRED) - set(FIELDS_OPTIONAL)
            missing = [k for k in FIELDS_REQUIRED if k not in c]
            if unknown or missing:
                s.err(f"{split}/golden.jsonl:{i}: unknown fields {sorted(unknown)}, missing {missing}")
                continue
            c["_split"] = split
            c["_line"] = i
            cases.append(c)
    for other in ("docs", "corpus.jsonl", "iam_v1.jsonl", "iam_v2.jsonl", "deletions.json"):
        p = os.path.join(s.dir, split, other)
        if os.path.realpath(p) != os.path.realpath(os.path.join(s.dir, other)):
            s.err(f"{split}/{other} must link to ../{other}")
    return cases


def check_set(d):
    s = SetData(d)
    cases = load_cases(s, "dev") + load_cases(s, "test")
    ids = set()
    corpus_grams = set()
    for doc in s.doc_groups:
        corpus_grams |= ngrams(words(s.text(doc)))
    all_text = {doc: s.text(doc) for doc in s.doc_groups}
    for c in cases:
        where = f"{c['_split']}/golden.jsonl:{c['_line']} ({c['id']})"
        e = lambda m: s.err(f"{where}: {m}")  # noqa: E731
        if c["id"] in ids:
            e("duplicate id")
        ids.add(c["id"])
        if c["kind"] not in KINDS:
            e(f"kind {c['kind']!r} not one of {sorted(KINDS)}")
        if c["phase"] != "v1" or c["valid_phases"] != ["v1", "v2", "after_delete"]:
            e("phase must be v1, valid in all three phases")
        user = c["user"]
        if user not in s.user_groups:
            e(f"unknown user {user}")
            continue
        for doc in c["relevant_doc_ids"] + c["forbidden_doc_ids"]:
            if doc not in s.doc_groups:
                e(f"unknown document {doc}")
        if any(doc not in s.doc_groups for doc in c["relevant_doc_ids"] + c["forbidden_doc_ids"]):
            continue
        for doc in c["relevant_doc_ids"]:
            if not s.readable(user, doc):
                e(f"relevant {doc} is not readable by {user}")
        for doc in c["forbidden_doc_ids"]:
            if s.readable(user, doc):
                e(f"forbidden {doc} is readable by {user}")
        readable = [doc for doc in s.doc_groups if s.readable(user, doc)]
        kind = c["kind"]
        rel, ans = c["relevant_doc_ids"], c["answer_contains"]
        if kind in ("answerable", "two_document"):
            if not rel or not ans:
                e("needs relevant_doc_ids and answer_contains")
            if c["forbidden_doc_ids"] or c["forbidden_strings"]:
                e("answerable cases forbid nothing here")
        if kind == "answerable":
            for a in ans:
                for doc in rel:
                    if norm_needle(a) not in s.text(doc):
                        e(f"answer {a!r} not in relevant {doc}")
        if kind == "two_document":
            if len(rel) < 2:
                e("two_document needs two relevant pages")
            for a in ans:
                if not any(norm_needle(a) in s.text(doc) for doc in rel):
                    e(f"answer {a!r} in no relevant page")
            for doc in rel:
                if not any(norm_needle(a) in s.text(doc) for a in ans):
                    e(f"relevant {doc} holds none of the answer strings")
            whole = [doc for doc in readable if all(norm_needle(a) in all_text[doc] for a in ans)]
            if whole:
                e(f"one readable page holds every answer string: {whole[:3]}")
        if kind in ("acl_denied", "unanswerable"):
            if rel or ans:
                e(f"{kind} has no relevant pages and no answer strings")
        if kind == "acl_denied":
            if not c["forbidden_doc_ids"] or not c["forbidden_strings"]:
                e("acl_denied needs forbidden_doc_ids and forbidden_strings")
            for f_ in c["forbidden_strings"]:
                if not any(norm_needle(f_) in s.text(doc) for doc in c["forbidden_doc_ids"]):
                    e(f"forbidden string {f_!r} in no forbidden page")
        for f_ in c["forbidden_strings"]:
            leak = [doc for doc in readable if norm_needle(f_) in all_text[doc]]
            if leak:
                e(f"forbidden string {f_!r} is on pages {user} may read: {leak[:3]}")
        if kind == "unanswerable":
            m = re.match(r"absent: (.+)$", c.get("note") or "")
            if not m:
                e('unanswerable needs note "absent: term; term"')
            else:
                for t in m.group(1).split(";"):
                    hit = [doc for doc in s.doc_groups if norm_needle(t.strip()) in all_text[doc]]
                    if hit:
                        e(f"absent term {t.strip()!r} is on {hit[:3]}")
        shared = ngrams(words(c["query"])) & corpus_grams
        if shared:
            e(f"query shares an 8-word run with a page: {sorted(shared)[0]!r}")
    per = {}
    for c in cases:
        per.setdefault(c["kind"], {"dev": 0, "test": 0})[c["_split"]] += 1
    for k, v in per.items():
        if not v["dev"] or not v["test"]:
            s.err(f"kind {k} missing from a split: {v}")
    if len(cases) < 100:
        s.err(f"{len(cases)} cases (< 100)")
    pdfs = sum(doc.endswith(".pdf") for doc in s.doc_groups)
    print(f"{s.name}: {len(s.doc_groups)} pages ({pdfs} PDF), {len(s.user_groups)} users, "
          f"{len(cases)} cases: " + ", ".join(f"{k} {v['dev']}+{v['test']}" for k, v in sorted(per.items())))
    return s.errors


def main():
    args = sys.argv[1:]
    if "--grep" in args:
        i = args.index("--grep")
        s = SetData(os.path.join(HERE, args[0]))
        for t in args[i + 1:]:
            hs = s.holders(t)
            print(f"{t!r}: {len(hs)} pages: " + ", ".join(f"{h}[{','.join(sorted(s.doc_groups[h]))}]" for h in hs[:12]))
        return 0
    sets = args or sorted(x for x in os.listdir(HERE)
                          if os.path.isfile(os.path.join(HERE, x, "iam_v1.jsonl")))
    errors = []
    for name in sets:
        errors += check_set(os.path.join(HERE, name))
    for m in errors:
        print("FAIL", m)
    print(f"{len(errors)} failures")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
