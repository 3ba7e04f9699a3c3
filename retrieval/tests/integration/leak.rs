//! What a user sees must not depend on documents they cannot read (issue 19, F2).
//!
//! Two tests: a direct one (a user's scores and order are bit-identical before and after
//! forbidden documents with the query's words are added, then deleted) and a probe: an attacker
//! issues 100 queries, half with a word that occurs only in forbidden documents (or, second
//! probe, also in forbidden documents), half with a word that does not (occur there), and the
//! best threshold / lookup classifier per observable, trained on half the queries, must not do
//! better than 0.55 on the other half. Timings are measured and printed, not asserted: they are
//! wall-clock and shown to admins only (the daemon strips them for other callers, see
//! docs/operations/side-channels.md).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use airlock_acl::AllowSet;
use airlock_retrieval::{
    DocumentInput, Retrieval, SearchMode, SearchRequest, SearchResponse, StageScores,
};

use crate::common::{Env, HashEmbedder, allow, bucket, test_config, word_spans};

/// Deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

fn req(query: &str, mode: SearchMode) -> SearchRequest<'_> {
    SearchRequest {
        query,
        k: 10,
        mode,
        rescore: true,
        rerank: false,
    }
}

fn bits(x: Option<f32>) -> Option<u32> {
    x.map(f32::to_bits)
}

/// Everything of a response except timings, scores as bit patterns.
fn seen(r: &SearchResponse) -> Vec<(u32, String, u32, [Option<u32>; 7])> {
    r.results
        .iter()
        .map(|x| {
            let StageScores {
                bm25,
                bm25_rank,
                vector,
                vector_rank,
                rrf,
                rescore,
                rerank,
            } = x.stage_scores.clone();
            (
                x.chunk_id,
                x.doc_id.clone(),
                x.score.to_bits(),
                [
                    bits(bm25),
                    bm25_rank,
                    bits(vector),
                    vector_rank,
                    bits(rrf),
                    bits(rescore),
                    bits(rerank),
                ],
            )
        })
        .collect()
}

/// The probe (2.168 → 0.571 → 1.279): forbidden documents with the query's words were
/// added, then deleted, and the user's own top score moved each time. Now it must not move by a
/// bit, in BM25 and in hybrid mode, and the admin's view (which includes those documents) does.
#[test]
fn forbidden_documents_never_change_a_users_scores_or_order() {
    for mode in [SearchMode::Bm25, SearchMode::Hybrid] {
        let env = Env::new();
        let eng = env.open(test_config());
        let mine: Vec<DocumentInput> = [
            "wing flutter at transonic speed",
            "flutter of a swept wing with boundary layer suction",
            "boundary layer transition on a flat plate",
            "heat transfer in a laminar boundary layer near the wing root of a delta wing",
            "panel flutter flutter flutter",
            "shock waves",
        ]
        .iter()
        .enumerate()
        .map(|(i, t)| DocumentInput::new(format!("mine{i}"), "", *t))
        .collect();
        let rep = eng.upsert(mine, &mut |_| {}).unwrap();
        let user = allow(rep.outcomes.iter().map(|o| o.ordinal));
        // Unrelated documents the user cannot read, so the corpus is not only theirs.
        let other: Vec<DocumentInput> = (0..20)
            .map(|i| DocumentInput::new(format!("other{i}"), "", format!("minutes of meeting {i}")))
            .collect();
        eng.upsert(other, &mut |_| {}).unwrap();
        let admin = allow(0..1000);
        let q = "wing flutter boundary layer";
        let before = eng.search(&req(q, mode), &user).unwrap();
        // BM25: the five documents with a query word; hybrid adds the sixth by vector.
        let expect = if mode == SearchMode::Bm25 { 5 } else { 6 };
        assert_eq!(before.results.len(), expect, "{mode:?}");
        let admin_before = seen(&eng.search(&req(q, mode), &admin).unwrap());

        // Forbidden documents full of the query's words, in three batches (three segments).
        for b in 0..3 {
            let docs: Vec<DocumentInput> = (0..15)
                .map(|i| {
                    DocumentInput::new(
                        format!("secret{b}-{i}"),
                        "Wing flutter",
                        format!("flutter flutter wing boundary layer report {i} of batch {b}"),
                    )
                })
                .collect();
            eng.upsert(docs, &mut |_| {}).unwrap();
        }
        let during = eng.search(&req(q, mode), &user).unwrap();
        assert_eq!(
            seen(&during),
            seen(&before),
            "{mode:?}: added forbidden docs"
        );
        assert_ne!(
            seen(&eng.search(&req(q, mode), &admin).unwrap()),
            admin_before,
            "the admin reads them, so their statistics do change"
        );
        // Tombstoned: still the same (tantivy keeps deleted documents in its segment
        // statistics until a merge; the search must not).
        for b in 0..3 {
            for i in 0..15 {
                eng.delete(&format!("secret{b}-{i}")).unwrap();
            }
        }
        let after = eng.search(&req(q, mode), &user).unwrap();
        assert_eq!(
            seen(&after),
            seen(&before),
            "{mode:?}: deleted forbidden docs"
        );
        assert_eq!(
            seen(&eng.search(&req(q, mode), &admin).unwrap()),
            admin_before,
            "{mode:?}: tombstoned documents are out of everyone's statistics"
        );
        // Reindex (dead chunks dropped, new segments): BM25 still the same. (Hybrid: a reindex
        // recalibrates the int8 quantizer from the whole corpus, so `vector` stage scores may
        // move by a rounding step then; see docs/operations/side-channels.md.)
        if mode == SearchMode::Bm25 {
            eng.reindex().unwrap();
            let re = eng.search(&req(q, mode), &user).unwrap();
            assert_eq!(seen(&re), seen(&before), "after reindex");
        }
    }
}

/// `Retrieval::mentions` (the answer path's unknown-term check) counts only chunks the caller
/// may read: a word only forbidden or deleted documents hold is not mentioned, exactly as if
/// they did not exist; the admin, who reads them, sees it. Words are analysed as the index does
/// (lower case, stemming), and a stop word is `None`.
#[test]
fn a_word_only_unreadable_documents_hold_is_not_mentioned() {
    let env = Env::new();
    let eng = env.open(test_config());
    let mine = vec![
        DocumentInput::new("mine0", "Tunnels", "Forwarding ports through an SSH tunnel"),
        DocumentInput::new("mine1", "Units", "The RestartSec setting of a service unit"),
    ];
    let rep = eng.upsert(mine, &mut |_| {}).unwrap();
    let user = allow(rep.outcomes.iter().map(|o| o.ordinal));
    let admin = allow(0..1000);
    let secret = vec![DocumentInput::new(
        "secret0",
        "Autossh",
        "autossh restarts tunnels; Tailscale exit nodes",
    )];
    eng.upsert(secret, &mut |_| {}).unwrap();
    let words = [
        "autossh",
        "Tailscale",
        "tunnels",
        "RESTARTSEC",
        "the",
        "mosh",
    ];
    assert_eq!(
        eng.mentions(&words, &user).unwrap(),
        [
            Some(false),
            Some(false),
            Some(true),
            Some(true),
            None,
            Some(false)
        ],
        "stemmed: `tunnels` is the user's `tunnel`; `autossh` only the secret holds"
    );
    assert_eq!(
        eng.mentions(&words, &admin).unwrap(),
        [
            Some(true),
            Some(true),
            Some(true),
            Some(true),
            None,
            Some(false)
        ]
    );
    eng.delete("secret0").unwrap();
    assert_eq!(
        eng.mentions(&["autossh"], &admin).unwrap(),
        [Some(false)],
        "a deleted document mentions nothing"
    );
}

/// One scalar or categorical thing the attacker observes per query.
enum Obs {
    Num(f64),
    Cat(String),
}

/// Best single-observable classifier, trained on `train`, accuracy on `test`. Scalars: the best
/// threshold and direction on the training half; categories: the training half's majority label
/// per value (ties and unseen values → label `false`).
fn accuracy(train: &[(&Obs, bool)], test: &[(&Obs, bool)]) -> f64 {
    let predict: Box<dyn Fn(&Obs) -> bool> = match train[0].0 {
        Obs::Num(_) => {
            let mut xs: Vec<(f64, bool)> = train
                .iter()
                .map(|(o, y)| match o {
                    Obs::Num(x) => (*x, *y),
                    Obs::Cat(_) => unreachable!(),
                })
                .collect();
            xs.sort_by(|a, b| a.0.total_cmp(&b.0));
            // Candidate thresholds: below everything, and between consecutive distinct values.
            let mut cuts = vec![f64::NEG_INFINITY];
            for w in xs.windows(2) {
                if w[0].0 < w[1].0 {
                    cuts.push((w[0].0 + w[1].0) / 2.0);
                }
            }
            let mut best = (0usize, f64::NEG_INFINITY, false);
            for &c in &cuts {
                for above in [true, false] {
                    let ok = xs
                        .iter()
                        .filter(|(x, y)| (*x > c) == above && *y || (*x > c) != above && !*y)
                        .count();
                    if ok > best.0 {
                        best = (ok, c, above);
                    }
                }
            }
            let (_, c, above) = best;
            Box::new(move |o| match o {
                Obs::Num(x) => (*x > c) == above,
                Obs::Cat(_) => false,
            })
        }
        Obs::Cat(_) => {
            let mut votes: HashMap<String, i64> = HashMap::new();
            for (o, y) in train {
                if let Obs::Cat(s) = o {
                    *votes.entry(s.clone()).or_default() += if *y { 1 } else { -1 };
                }
            }
            Box::new(move |o| match o {
                Obs::Cat(s) => votes.get(s).is_some_and(|v| *v > 0),
                Obs::Num(_) => false,
            })
        }
    };
    let ok = test.iter().filter(|(o, y)| predict(o) == *y).count();
    ok as f64 / test.len() as f64
}

/// What the attacker records per query: observable name → value. Timing observables are named
/// `time:` (engine `timings` fields and the call's wall clock).
fn observe(eng: &Retrieval, query: &str, mode: SearchMode, user: &AllowSet) -> Vec<(String, Obs)> {
    let t = Instant::now();
    let r = eng.search(&req(query, mode), user).unwrap();
    let wall = t.elapsed().as_secs_f64() * 1e3;
    let s = seen(&r);
    let mut out = vec![
        ("results".into(), Obs::Num(r.results.len() as f64)),
        (
            "result set and order".into(),
            Obs::Cat(format!("{:?}", s.iter().map(|x| x.0).collect::<Vec<_>>())),
        ),
        ("everything but timings".into(), Obs::Cat(format!("{s:?}"))),
        (
            "score sum".into(),
            Obs::Num(r.results.iter().map(|x| f64::from(x.score)).sum()),
        ),
    ];
    for i in 0..3 {
        let x = r.results.get(i);
        out.push((
            format!("score #{}", i + 1),
            Obs::Num(x.map_or(-1.0, |x| f64::from(x.score))),
        ));
        let st = x.map(|x| x.stage_scores.clone()).unwrap_or_default();
        for (name, v) in [
            ("bm25", st.bm25),
            ("vector", st.vector),
            ("rrf", st.rrf),
            ("rescore", st.rescore),
        ] {
            out.push((
                format!("{name} #{}", i + 1),
                Obs::Num(v.map_or(-1.0, f64::from)),
            ));
        }
    }
    let tm = &r.timings;
    for (name, v) in [
        ("embed_ms", tm.embed_ms),
        ("bm25_ms", tm.bm25_ms),
        ("vector_ms", tm.vector_ms),
        ("fuse_ms", tm.fuse_ms),
        ("rescore_ms", tm.rescore_ms),
        ("fetch_ms", tm.fetch_ms),
        ("total_ms", tm.total_ms),
    ] {
        out.push((format!("time:{name}"), Obs::Num(v)));
    }
    out.push(("time:wall clock".into(), Obs::Num(wall)));
    out
}

/// Runs the attacker: `queries` (query, label) shuffled with a fixed seed and asked once each,
/// then per observable the classifier accuracy on a stratified half. Returns name → accuracy.
fn attack(
    eng: &Retrieval,
    user: &AllowSet,
    mode: SearchMode,
    mut queries: Vec<(String, bool)>,
    seed: u64,
) -> Vec<(String, f64)> {
    let mut rng = Rng(seed);
    rng.shuffle(&mut queries);
    // Warm caches with unrelated queries first, so the first probe is not the cold one.
    for w in ["warm up query", "treasury", "ledger"] {
        eng.search(&req(w, mode), user).unwrap();
    }
    let runs: Vec<(Vec<(String, Obs)>, bool)> = queries
        .iter()
        .map(|(q, y)| (observe(eng, q, mode, user), *y))
        .collect();
    // Stratified split in issue order: each label's first half trains, second half tests.
    let mut seen_label = [0usize; 2];
    let per_label = [
        queries.iter().filter(|q| !q.1).count(),
        queries.iter().filter(|q| q.1).count(),
    ];
    let in_train: Vec<bool> = runs
        .iter()
        .map(|(_, y)| {
            let l = usize::from(*y);
            seen_label[l] += 1;
            seen_label[l] <= per_label[l] / 2
        })
        .collect();
    let names: Vec<String> = runs[0].0.iter().map(|(n, _)| n.clone()).collect();
    names
        .iter()
        .enumerate()
        .map(|(j, name)| {
            let (mut train, mut test) = (Vec::new(), Vec::new());
            for ((obs, y), tr) in runs.iter().zip(&in_train) {
                let o = (&obs[j].1, *y);
                if *tr { train.push(o) } else { test.push(o) }
            }
            (name.clone(), accuracy(&train, &test))
        })
        .collect()
}

/// Made-up words the analyzer keeps as they are (no stop word, no stem change) whose
/// [`HashEmbedder`] component is not used by `taken`, so the vector side treats them all alike.
fn words(
    n: usize,
    prefix: &str,
    dim: usize,
    taken: &mut std::collections::HashSet<usize>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0u32;
    while out.len() < n {
        let mut w = format!("zq{prefix}");
        let mut x = i;
        for _ in 0..3 {
            w.push((b'a' + (x % 26) as u8) as char);
            x /= 26;
        }
        w.push('x');
        i += 1;
        if taken.insert(bucket(&w, dim)) {
            out.push(w);
        }
    }
    out
}

/// Probe A: "word only in forbidden documents" vs "word nowhere". Probe B: a word of the user's
/// own document that also occurs in many forbidden ones vs one that does not. 100 queries each.
#[test]
fn probe_attacker_cannot_tell_forbidden_words_from_absent_ones() {
    const DIM: usize = 1024;
    let env = Env::new();
    let eng = Retrieval::open(
        &env.dir.path().join("airlock.db"),
        &env.index(),
        test_config(),
        Arc::new(HashEmbedder {
            dim: DIM,
            max_tokens: 256,
        }),
        None,
    )
    .unwrap();
    let visible_a: Vec<String> = (0..20)
        .map(|i| {
            format!(
                "treasury liquidity report {}",
                ["alpha", "beta", "gamma", "delta"][i % 4]
            )
        })
        .collect();
    let mut taken: std::collections::HashSet<usize> = visible_a
        .iter()
        .flat_map(|t| {
            word_spans(t)
                .into_iter()
                .map(|(s, e)| bucket(&t[s..e], DIM))
        })
        .collect();
    taken.insert(bucket("ledger", DIM));
    let forbidden_only = words(50, "f", DIM, &mut taken);
    let absent = words(50, "a", DIM, &mut taken);
    let shared = words(50, "s", DIM, &mut taken);
    let mine_only = words(50, "m", DIM, &mut taken);
    // The user's documents: 20 short reports and one ledger holding every probe-B word once.
    let mut docs: Vec<DocumentInput> = visible_a
        .iter()
        .enumerate()
        .map(|(i, t)| DocumentInput::new(format!("mine{i}"), "", t.clone()))
        .collect();
    let mut ledger_words: Vec<String> = shared.iter().chain(&mine_only).cloned().collect();
    Rng(7).shuffle(&mut ledger_words);
    docs.push(DocumentInput::new(
        "ledger",
        "",
        format!("ledger {}", ledger_words.join(" ")),
    ));
    let rep = eng.upsert(docs, &mut |_| {}).unwrap();
    assert!(rep.errors.is_empty());
    let user = allow(rep.outcomes.iter().map(|o| o.ordinal));
    // 300 forbidden documents, each with a random half of the forbidden-only and shared words.
    let mut rng = Rng(11);
    let forbidden: Vec<DocumentInput> = (0..300)
        .map(|i| {
            let mut ws: Vec<&String> = forbidden_only
                .iter()
                .chain(&shared)
                .filter(|_| rng.below(2) == 0)
                .collect();
            rng.shuffle(&mut ws);
            let text: Vec<&str> = ws.iter().map(|s| s.as_str()).collect();
            DocumentInput::new(
                format!("secret{i}"),
                "",
                format!("treasury memo {}", text.join(" ")),
            )
        })
        .collect();
    let rep = eng.upsert(forbidden, &mut |_| {}).unwrap();
    assert!(rep.errors.is_empty());
    assert!(rep.outcomes.iter().all(|o| !user.contains(o.ordinal)));

    let probe_a: Vec<(String, bool)> = forbidden_only
        .iter()
        .map(|w| (format!("treasury {w}"), true))
        .chain(absent.iter().map(|w| (format!("treasury {w}"), false)))
        .collect();
    let probe_b: Vec<(String, bool)> = shared
        .iter()
        .map(|w| (w.clone(), true))
        .chain(mine_only.iter().map(|w| (w.clone(), false)))
        .collect();
    let mut failures = Vec::new();
    for (probe, queries) in [("A", &probe_a), ("B", &probe_b)] {
        for mode in [SearchMode::Bm25, SearchMode::Hybrid] {
            let acc = attack(&eng, &user, mode, queries.clone(), 42);
            for (name, a) in &acc {
                let timing = name.starts_with("time:");
                println!(
                    "probe {probe} {mode:?}: {name}: accuracy {a:.2}{}",
                    if timing {
                        " (timing: reported, not asserted)"
                    } else {
                        ""
                    }
                );
                if !timing && *a > 0.55 {
                    failures.push(format!("probe {probe} {mode:?} {name}: {a:.2}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "observables that tell the classes apart: {failures:#?}"
    );
}
