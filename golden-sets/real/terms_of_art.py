"""What `abstain_on_unknown_terms` does to each set's questions, by the rule applied to the pages'
text (docs/operations/answer-sources.md): per set and split, how many questions of each kind
name a term of art that no page the asking user may read mentions (those get "cannot find").

An approximation of the appliance's rule (rag/src/terms.rs): the pages' text from pagetext.py,
not the appliance's chunks; Snowball English stemming as the BM25 index's analyser; the
embedder's WordPiece vocabulary read from its tokenizer.json (greedy longest match).

    pip install snowballstemmer
    python3 golden-sets/real/terms_of_art.py [TOKENIZER_JSON] [BANK_DEV_DIR]

Defaults: models-cache/staging/minilm/tokenizer.json and ../shared/datasets/bank-dev (skipped
when absent). With V=1 it prints the answerable and two-document questions it stops.
"""
import json
import os
import re
import sys
import collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pagetext import page_text  # noqa: E402
import snowballstemmer  # noqa: E402
ST=snowballstemmer.stemmer('english')
HERE=os.path.dirname(os.path.abspath(__file__))
TOKENIZER=sys.argv[1] if len(sys.argv)>1 else 'models-cache/staging/minilm/tokenizer.json'
BANK=sys.argv[2] if len(sys.argv)>2 else os.path.join(HERE,'../../../shared/datasets/bank-dev')
VOCAB=json.load(open(TOKENIZER))['model']['vocab']
def wp(word):
    w=word.lower(); out=0; start=0
    while start<len(w):
        end=len(w); cur=None
        while end>start:
            sub=w[start:end] if start==0 else '##'+w[start:end]
            if sub in VOCAB: cur=sub; break
            end-=1
        if cur is None: return 99
        out+=1; start=end
    return out
def stemset(text):
    return set(ST.stemWords([w.lower() for w in re.findall(r"[A-Za-z0-9]+",text)]))
def trim(raw):
    t=re.sub(r"^[^\w/]+|[^\w/]+$","",raw)
    for s in ("'s","’s"):
        if t.endswith(s): t=t[:-2]
    return t.rstrip('./')
def identifier(t):
    letters=any(c.isalpha() for c in t); digits=any(c.isdigit() for c in t)
    inner=any(a.islower() and b.isupper() for a,b in zip(t,t[1:]))
    return (letters and digits) or inner or '_' in t or any(c in t.strip('./') for c in './')
def rare(t):
    if not all(c.islower() or c=='-' for c in t): return False
    ps=[p for p in t.split('-') if p]
    return bool(ps) and all(len(p)>=4 and wp(p)>=3 for p in ps)
def terms(q):
    out=[]; toks=q.split()
    for i,raw in enumerate(toks):
        t=trim(raw)
        if not t or t[0].isdigit(): continue
        clause_start = i==0 or toks[i-1][-1:] in ':.?!;'
        name = (not clause_start) and t[:1].isupper() and any(c.islower() for c in t) and sum(c.isupper() for c in t)<sum(c.isalpha() for c in t) and not (i+1<len(toks) and re.fullmatch(r"\d{1,3}\W*",toks[i+1]))
        if name or identifier(t) or rare(t):
            if t not in out: out.append(t)
    return out
def spellings(p):
    out=[p]
    if len(p)>3 and p.endswith('s'): out.append(p[:-1])
    am=[]
    for w in out:
        for gb,us in [("isation","ization"),("ise","ize"),("ising","izing"),("ised","ized"),("iser","izer"),("yse","yze"),("our","or"),("tre","ter")]:
            if w.endswith(gb): am.append(w[:-len(gb)]+us)
    return out+am
STOP=set("a an and are as at be but by for if in into is it no not of on or such that the their then there these they this to was will with".split())
def unknown(ts, present):
    bad=[]
    for t in ts:
        for p in [x.lower() for x in re.split(r"[^A-Za-z0-9]+",t) if len(x)>=2]:
            if not any(s in STOP or ST.stemWord(s) in present for s in spellings(p)):
                bad.append(t); break
    return bad
def cases_real(setdir, split):
    base=os.path.join(HERE,setdir)
    texts={}
    for root,_,fs in os.walk(f'{base}/docs'):
        for f in fs:
            if not f.startswith('.'):
                p=os.path.join(root,f); texts[os.path.relpath(p,f'{base}/docs')]=page_text(p)
    acl={json.loads(l)['path']:json.loads(l) for l in open(f'{base}/docs/.acl.jsonl')}
    iam={d['user']:set(d['groups']) for d in map(json.loads,open(f'{base}/iam_v1.jsonl')) if 'user' in d}
    for l in open(f'{base}/{split}/golden.jsonl'):
        c=json.loads(l)
        if c['phase']!='v1': continue
        g=iam.get(c['user'],set())
        yield c,[texts[f] for f,a in acl.items() if f in texts and (c['user'] in a['users'] or g & set(a['groups']))]
def cases_bank():
    B=BANK
    texts={d['doc_id']:d['title']+'\n'+d['text'] for d in map(json.loads,open(f'{B}/corpus.jsonl'))}
    iam={};acl={}
    for d in map(json.loads,open(f'{B}/iam_v1.jsonl')):
        if 'user' in d: iam[d['user']]=set(d['groups'])
        else: acl[d['doc']]=d
    for l in open(f'{B}/golden.jsonl'):
        c=json.loads(l)
        if c['phase']!='v1': continue
        g=iam.get(c['user'],set())
        yield c,[texts[f] for f,a in acl.items() if c['user'] in a['users'] or g & set(a['groups'])]
cache={}
def run(name, it):
    cache.clear()
    st=collections.Counter(); tot=collections.Counter()
    for c,docs in it:
        key=id(docs[0]) if docs else 0
        present=set()
        for d in docs:
            k=id(d)
            if k not in cache: cache[k]=stemset(d)
            present|=cache[k]
        bad=unknown(terms(c['query']),present)
        tot[c['kind']]+=1
        if bad: st[c['kind']]+=1
        if bad and os.environ.get('V') and c['kind'] in ('answerable','two_document','multi_doc','near_duplicate'): print('  FP',c['kind'],bad,c['query'][:90])
    print(name, {k:f"{st[k]}/{tot[k]}" for k in tot})
for s in ['systemd-openssh','debian-handbook','python-stdlib']:
    for sp in ['dev','test']:
        run(f'{s} {sp}', cases_real(s,sp))
if os.path.exists(os.path.join(BANK,'golden.jsonl')):
    run('bank-dev', cases_bank())
