//! The eval runner: drives a daemon through its public API, phase by phase, and scores what users
//! would have seen.
//!
//! End-to-end sets (bank layout): ingest `corpus.jsonl` and apply `iam_v1.jsonl` → `v1` cases →
//! apply `iam_v2.jsonl` → `v2` cases → delete `deletions.json` → `after_delete` cases.
//! Retrieval sets (BEIR layout): ingest the corpus readable by one eval user, then score every
//! judged query through `/v1/retrieve`.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::Error;
use crate::client::{ApiError, ChatOutcome, Client, RetrieveResponse};
use crate::formats::{self, BeirDoc, GoldenCase, Phase, Turn};
use crate::gate::Report;
use crate::metrics::{self, CaseScore, Observation};

/// User id → bearer token. `admin` is the operator's token.
pub type Tokens = BTreeMap<String, String>;

/// How to run a set.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The ladder rung this run measures (recorded in the report; `None`: the daemon chooses).
    pub rung: Option<u8>,
    /// Send `rung` with every chat request (`airlock.rung`). The daemon accepts a forced rung
    /// from admin-role callers only, so against an operator's appliance the case users' tokens
    /// must belong to admins; a runner that owns the daemon pins the daemon's rung itself and
    /// sets this to `false`.
    pub rung_in_requests: bool,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Chunks retrieved per query.
    pub top_k: usize,
    /// Retrieval mode: `hybrid`, `bm25` or `vector`.
    pub mode: String,
    /// Ask for answers (chat completions) as well as retrieval.
    pub answers: bool,
    /// With `answers`, ask for answers on at most this many cases per phase, spread evenly over
    /// the phase in set order; the others are scored on retrieval and leaks only. `None`: every
    /// case.
    pub answer_cases: Option<usize>,
    /// `max_tokens` for answers.
    pub max_tokens: u32,
    /// Keep each answer's text in the report (`CaseScore::answer`), to read why a case failed.
    /// Off by default: answers quote documents, and reports travel further than the appliance.
    pub record_answers: bool,
    /// Model alias for answers (`None`: the daemon's default).
    pub model: Option<String>,
    /// Ingest the corpus, sync `iam_v1` and issue user tokens first. Without it the daemon must
    /// already hold the corpus in its `iam_v1` state; the phase transitions (`iam_v2`, the
    /// deletions) are applied either way.
    pub setup: bool,
    /// Set (e.g. by a signal handler) to stop the run: no further case starts, and the run
    /// ends with [`RunError::Interrupted`] instead of a report.
    pub stop: Option<Arc<AtomicBool>>,
    /// Also answer every answered case the plain way ([`plain_prompt`]: the same retrieval and
    /// model, the top [`RunOptions::plain_top_k`] chunks' full text in a stuff-documents
    /// prompt, no answer-path rules), scored into [`Report::plain_baseline`], so every
    /// answer-path rule is measured beside what a plain RAG chain gives.
    pub plain_baseline: bool,
    /// Chunks in the plain baseline's prompt.
    pub plain_top_k: usize,
    /// Instead of an answer, ask for the chunks the chat would place in its prompt
    /// ([`Client::prompt_sources`]) and score those: citation recall is then "an answering
    /// document among the prompt sources" and abstention "no prompt source" (the answer path
    /// then abstains without generating). No generation: a rule of the source selection is
    /// measured on a whole set in minutes.
    pub sources_only: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            rung: None,
            rung_in_requests: true,
            concurrency: 2,
            top_k: 10,
            mode: "hybrid".into(),
            answers: true,
            answer_cases: None,
            max_tokens: 160,
            record_answers: false,
            model: None,
            setup: true,
            stop: None,
            plain_baseline: false,
            plain_top_k: 5,
            sources_only: false,
        }
    }
}

/// Progress of a run: (what, done, total).
pub type Progress<'a> = &'a (dyn Fn(&str, usize, usize) + Sync);

/// A run failure.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The set could not be read.
    #[error(transparent)]
    Set(#[from] Error),
    /// The daemon refused a set-up or phase step.
    #[error("{step}: {source}")]
    Api {
        /// What the runner was doing.
        step: String,
        /// The API error.
        source: ApiError,
    },
    /// A case's user has no token.
    #[error("no token for user {0:?} (pass it in the tokens file or let the runner set up)")]
    MissingToken(String),
    /// The run was stopped (`RunOptions::stop`) before every case ran.
    #[error("interrupted: the run was stopped before every case ran (no report)")]
    Interrupted,
}

fn api(step: impl Into<String>) -> impl FnOnce(ApiError) -> RunError {
    let step = step.into();
    move |source| RunError::Api { step, source }
}

/// Runs `f` over `items` with `concurrency` threads; results in input order.
fn parallel<T: Sync, R: Send>(
    items: &[T],
    concurrency: usize,
    what: &str,
    progress: Progress<'_>,
    f: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..concurrency.max(1) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    out.lock().expect("results lock")[i] = Some(r);
                    progress(what, done.fetch_add(1, Ordering::Relaxed) + 1, items.len());
                }
            });
        }
    });
    out.into_inner()
        .expect("results lock")
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

fn read_text(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

fn snapshot_users(ndjson: &str) -> Vec<String> {
    ndjson
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["user"].as_str().map(str::to_owned))
        .collect()
}

fn ingest(
    client: &Client,
    admin: &str,
    corpus: &[BeirDoc],
    opts: &RunOptions,
    progress: Progress<'_>,
) -> Result<(), RunError> {
    let results = parallel(corpus, opts.concurrency, "ingest", progress, |d| {
        client
            .put_document(admin, &d.id, &d.title, &d.text, &d.metadata)
            .map_err(api(format!("ingest {}", d.id)))
    });
    results.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

/// Ingests a set's files as they are (`PUT /v1/documents/{id}` with the file's bytes).
fn ingest_files(
    client: &Client,
    admin: &str,
    files: &[SetFile],
    opts: &RunOptions,
    progress: Progress<'_>,
) -> Result<(), RunError> {
    let results = parallel(files, opts.concurrency, "ingest files", progress, |f| {
        let bytes = std::fs::read(&f.path).map_err(|source| Error::Io {
            path: f.path.clone(),
            source,
        })?;
        client
            .put_document_file(admin, &f.id, &bytes, f.media_type)
            .map_err(api(format!("ingest {}", f.id)))
    });
    results.into_iter().collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

/// Issues a token to each of `users` that has none in `tokens`, approved by the `approver`
/// token when `tokens` holds one (a second admin: four eyes).
fn issue_tokens(
    client: &Client,
    admin: &str,
    users: &[String],
    tokens: &mut Tokens,
) -> Result<(), RunError> {
    let approver = tokens.get("approver").cloned();
    for u in users {
        if !tokens.contains_key(u) {
            let t = client
                .issue_token_approved(admin, approver.as_deref(), u)
                .map_err(api(format!("issue token for {u}")))?;
            tokens.insert(u.clone(), t);
        }
    }
    Ok(())
}

/// What one case produced, with its latencies.
struct CaseRun {
    score: CaseScore,
    latency: Vec<(String, f64)>,
    bundle_version: Option<String>,
    /// The plain baseline's score and latencies ([`RunOptions::plain_baseline`]).
    plain: Option<(CaseScore, Vec<(String, f64)>)>,
}

/// An observation, its per-stage latencies (ms) and the bundle version the daemon reported.
type Observed = (Observation, Vec<(String, f64)>, Option<String>);

/// The plain baseline's prompt: LangChain's stuff-documents question-answering prompt (the
/// default of its `load_qa_chain(chain_type="stuff")`), the chunks' texts joined by blank
/// lines as that chain joins them.
pub fn plain_prompt(chunks: &[&str], question: &str) -> String {
    format!(
        "Use the following pieces of context to answer the question at the end. If you don't \
know the answer, just say that you don't know, don't try to make up an answer.\n\n{}\n\n\
Question: {question}\nHelpful Answer:",
        chunks.join("\n\n")
    )
}

/// The plain baseline for one case: the top `plain_top_k` chunks the caller may read, by the
/// same retrieval, with their full text in [`plain_prompt`], answered by the same model with
/// no retrieval of the daemon's own (so none of the answer path's rules). What it shows the
/// user are those chunks, whole.
fn observe_plain(
    client: &Client,
    token: &str,
    history: &[Turn],
    query: &str,
    opts: &RunOptions,
) -> Result<(Observation, Vec<(String, f64)>), ApiError> {
    let mut obs = Observation::default();
    let r = match client.retrieve_as(token, history, query, opts.plain_top_k, &opts.mode, true) {
        Ok(r) => r,
        Err(e) if e.status() == Some(401) => {
            obs.refused = true;
            return Ok((obs, Vec::new()));
        }
        Err(e) => return Err(e),
    };
    let texts: Vec<String> = r
        .results
        .iter()
        .map(|c| c.text.clone().unwrap_or_else(|| c.snippet.clone()))
        .collect();
    for c in &r.results {
        obs.retrieved_doc_ids.push(c.doc_id.clone());
        obs.cited_doc_ids.push(c.doc_id.clone());
        obs.titles.push(c.title.clone());
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let out = client.chat_plain(
        token,
        opts.model.as_deref(),
        &plain_prompt(&refs, query),
        opts.rung.filter(|_| opts.rung_in_requests),
        opts.max_tokens,
    )?;
    obs.answer = out.answer;
    obs.snippets = texts.clone();
    obs.source_texts = Some(texts);
    let mut lat = vec![("chat.total".to_owned(), out.latency_ms)];
    for (stage, ms) in out.stages_ms {
        lat.push((format!("chat.{stage}"), ms));
    }
    Ok((obs, lat))
}

fn observe(
    client: &Client,
    token: &str,
    history: &[Turn],
    query: &str,
    answer: bool,
    opts: &RunOptions,
) -> Result<Observed, ApiError> {
    let mut obs = Observation {
        retrieval_only: !answer,
        ..Observation::default()
    };
    let mut lat = Vec::new();
    let r: RetrieveResponse =
        match client.retrieve_after(token, history, query, opts.top_k, &opts.mode) {
            Ok(r) => r,
            Err(e) if e.status() == Some(401) => {
                obs.refused = true;
                return Ok((obs, lat, None));
            }
            Err(e) => return Err(e),
        };
    for (stage, v) in &r.timings_ms {
        if let Some(ms) = v.as_f64() {
            lat.push((format!("retrieve.{stage}"), ms));
        }
    }
    for c in &r.results {
        obs.retrieved_doc_ids.push(c.doc_id.clone());
        obs.snippets.push(c.snippet.clone());
        obs.titles.push(c.title.clone());
    }
    let mut version = None;
    if answer && opts.sources_only {
        let r = client.prompt_sources(token, history, query, &opts.mode)?;
        obs.sources_only = true;
        for c in r.results {
            obs.cited_doc_ids.push(c.doc_id);
            obs.snippets.push(c.snippet);
            obs.titles.push(c.title);
        }
    } else if answer {
        let ChatOutcome {
            answer,
            citations,
            cited,
            bundle_version,
            latency_ms,
            stages_ms,
            source_texts,
            ..
        } = client.chat(
            token,
            opts.model.as_deref(),
            history,
            query,
            opts.rung.filter(|_| opts.rung_in_requests),
            opts.max_tokens,
        )?;
        lat.push(("chat.total".into(), latency_ms));
        for (stage, ms) in stages_ms {
            lat.push((format!("chat.{stage}"), ms));
        }
        obs.answer = answer;
        obs.source_texts = source_texts;
        obs.used_doc_ids = cited.map(|ns| {
            ns.iter()
                .filter_map(|&n| n.checked_sub(1).and_then(|i| citations.get(i)))
                .map(|c| c.doc_id.clone())
                .collect()
        });
        for c in citations {
            obs.cited_doc_ids.push(c.doc_id);
            obs.snippets.push(c.snippet);
            obs.titles.push(c.title);
        }
        version = bundle_version;
    }
    Ok((obs, lat, version))
}

fn run_cases(
    client: &Client,
    cases: &[&GoldenCase],
    tokens: &Tokens,
    opts: &RunOptions,
    what: &str,
    progress: Progress<'_>,
) -> Result<Vec<CaseRun>, RunError> {
    let numbered: Vec<(usize, &GoldenCase)> = cases.iter().copied().enumerate().collect();
    let stopped = || {
        opts.stop
            .as_ref()
            .is_some_and(|s| s.load(Ordering::Relaxed))
    };
    let runs = parallel(&numbered, opts.concurrency, what, progress, |&(i, case)| {
        if stopped() {
            return Err(RunError::Interrupted);
        }
        let Some(token) = tokens.get(&case.user) else {
            return Err(RunError::MissingToken(case.user.clone()));
        };
        let answer = opts.answers && opts.answer_cases.is_none_or(|n| sampled(i, n, cases.len()));
        let failed =
            |e: ApiError| metrics::CaseScore::failed(case, format!("case {}: {e}", case.id));
        let scored = |obs: Observation| {
            let mut score = metrics::score_case(case, &obs);
            if opts.record_answers && answer {
                score.answer = Some(obs.answer);
            }
            score
        };
        // The plain baseline answers the same cases as the answer path.
        let plain = (answer && opts.plain_baseline).then(|| {
            match observe_plain(client, token, &case.history, &case.query, opts) {
                Ok((obs, latency)) => (scored(obs), latency),
                Err(e) => (failed(e), Vec::new()),
            }
        });
        // A failed request fails its case, not the run: the report keeps every other case
        // and the gate refuses a run with failed cases.
        Ok(
            match observe(client, token, &case.history, &case.query, answer, opts) {
                Ok((obs, latency, bundle_version)) => CaseRun {
                    score: scored(obs),
                    latency,
                    bundle_version,
                    plain,
                },
                Err(e) => CaseRun {
                    score: failed(e),
                    latency: Vec::new(),
                    bundle_version: None,
                    plain,
                },
            },
        )
    });
    // A request cut by the stop (the daemon going away) is not a failed case: the run as a
    // whole is interrupted.
    if stopped() {
        return Err(RunError::Interrupted);
    }
    runs.into_iter().collect()
}

/// Whether case `i` of `len` is among `n` cases spread evenly over the phase (every
/// `len / n`-th case, starting with the first), so a sampled run sees every kind in about its
/// share rather than only the set's first cases.
fn sampled(i: usize, n: usize, len: usize) -> bool {
    n >= len || (i * n) % len < n
}

/// A document of a set given as a file (`docs/` of the set): ingested as the file itself, so
/// the daemon's extractor reads it as it reads an operator's (HTML with its navigation, PDF).
#[derive(Debug, Clone)]
pub struct SetFile {
    /// The document id: the file's path below `docs/`, `/`-separated.
    pub id: String,
    /// Where the file is.
    pub path: PathBuf,
    /// Its media type, from the extension.
    pub media_type: &'static str,
}

/// The media type the daemon takes for a file name's extension (`None`: not a document).
pub fn media_type_of(name: &str) -> Option<&'static str> {
    let ext = name.rsplit_once('.')?.1.to_ascii_lowercase();
    Some(match ext.as_str() {
        "html" | "htm" => "text/html",
        "pdf" => "application/pdf",
        "txt" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "eml" => "message/rfc822",
        "docx" => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "xlsx" => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "pptx" => "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        _ => return None,
    })
}

/// Every document file below `docs` (names starting with `.`, such as a folder ingest's
/// `.acl.jsonl`, are not documents), sorted by id; a file of no known type is an error.
fn set_files(docs: &Path) -> Result<Vec<SetFile>, Error> {
    let mut out = Vec::new();
    let mut dirs = vec![docs.to_owned()];
    while let Some(dir) = dirs.pop() {
        let io = |source| Error::Io {
            path: dir.clone(),
            source,
        };
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Some(media_type) = media_type_of(&name) else {
                return Err(Error::Invalid {
                    path,
                    message: "not a document type the daemon ingests".into(),
                });
            };
            let rel = path.strip_prefix(docs).unwrap_or(&path);
            let id = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push(SetFile {
                id,
                path,
                media_type,
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The files of an end-to-end set directory.
pub struct GoldenSet {
    /// Set name (directory name).
    pub name: String,
    /// Corpus documents.
    pub corpus: Vec<BeirDoc>,
    /// Documents given as files (`docs/`, ingested as they are; their grants come from
    /// `iam_v1.jsonl`). Empty when the set has no `docs/` folder.
    pub files: Vec<SetFile>,
    /// First IAM snapshot (JSON Lines text).
    pub iam_v1: String,
    /// Second IAM snapshot.
    pub iam_v2: String,
    /// Document ids deleted before the `after_delete` phase.
    pub deletions: Vec<String>,
    /// The cases.
    pub cases: Vec<GoldenCase>,
}

impl GoldenSet {
    /// Reads a bank-layout set directory strictly.
    pub fn read(dir: &Path) -> Result<Self, Error> {
        let p = |f: &str| -> PathBuf { dir.join(f) };
        let corpus_path = p("corpus.jsonl");
        let corpus = formats::parse_jsonl(&corpus_path, &read_text(&corpus_path)?)?;
        let del_path = p("deletions.json");
        let deletions: Vec<String> =
            serde_json::from_str(&read_text(&del_path)?).map_err(|e| Error::Parse {
                path: del_path.clone(),
                line: e.line(),
                message: e.to_string(),
            })?;
        let docs = p("docs");
        let files = if docs.is_dir() {
            set_files(&docs)?
        } else {
            Vec::new()
        };
        Ok(GoldenSet {
            name: dir
                .file_name()
                .map_or("set".into(), |n| n.to_string_lossy().into_owned()),
            corpus,
            files,
            iam_v1: read_text(&p("iam_v1.jsonl"))?,
            iam_v2: read_text(&p("iam_v2.jsonl"))?,
            deletions,
            cases: read_cases(dir)?,
        })
    }
}

/// Runs an end-to-end set through every phase and returns the report.
/// Tokens issued during set-up are added to `tokens`, so a later run (another rung) can reuse them.
pub fn run_golden(
    client: &Client,
    set: &GoldenSet,
    tokens: &mut Tokens,
    opts: &RunOptions,
    progress: Progress<'_>,
) -> Result<Report, RunError> {
    let admin = tokens
        .get("admin")
        .cloned()
        .ok_or_else(|| RunError::MissingToken("admin".into()))?;
    if opts.setup {
        ingest(client, &admin, &set.corpus, opts, progress)?;
        ingest_files(client, &admin, &set.files, opts, progress)?;
        client
            .acl_sync(&admin, &set.iam_v1)
            .map_err(api("sync iam_v1"))?;
    }
    // Users the caller has no token for (all of them on prepared state) get one now.
    issue_tokens(client, &admin, &snapshot_users(&set.iam_v1), tokens)?;
    let mut runs = Vec::new();
    for phase in Phase::ALL {
        match phase {
            Phase::V1 => {}
            // The transitions between phases are part of the set (what its v2 and after_delete
            // cases test), not of the setup: they run with and without `setup`. Scoring v2
            // cases against a v1 state would report every revocation as a leak.
            Phase::V2 => {
                client
                    .acl_sync(&admin, &set.iam_v2)
                    .map_err(api("sync iam_v2"))?;
                issue_tokens(client, &admin, &snapshot_users(&set.iam_v2), tokens)?;
            }
            Phase::AfterDelete => {
                for d in &set.deletions {
                    client
                        .delete_document(&admin, d)
                        .map_err(api(format!("delete {d}")))?;
                }
            }
        }
        let cases: Vec<&GoldenCase> = set.cases.iter().filter(|c| c.phase == phase).collect();
        runs.extend(run_cases(
            client,
            &cases,
            tokens,
            opts,
            phase.as_str(),
            progress,
        )?);
    }
    Ok(with_version(
        client,
        &admin,
        report(&set.name, opts.rung, runs),
    ))
}

/// Fills in the bundle version from `GET /v1/info` when no answer reported it (retrieval-only
/// runs); a daemon without that route leaves it unknown.
fn with_version(client: &Client, token: &str, mut r: Report) -> Report {
    if r.bundle_version.is_none() {
        r.bundle_version = client.bundle_version(token).ok().flatten();
    }
    r
}

/// Runs, without changing the daemon's state, every case that holds after the last phase
/// (`valid_phases` contains `after_delete`). Used for per-rung sweeps after one full run.
pub fn run_golden_final_state(
    client: &Client,
    set: &GoldenSet,
    tokens: &Tokens,
    opts: &RunOptions,
    progress: Progress<'_>,
) -> Result<Report, RunError> {
    let cases: Vec<&GoldenCase> = set
        .cases
        .iter()
        .filter(|c| c.valid_phases.contains(&Phase::AfterDelete))
        .collect();
    let runs = run_cases(client, &cases, tokens, opts, "final-state", progress)?;
    let r = report(&set.name, opts.rung, runs);
    Ok(match tokens.get("admin") {
        Some(admin) => with_version(client, admin, r),
        None => r,
    })
}

fn report(name: &str, rung: Option<u8>, runs: Vec<CaseRun>) -> Report {
    let mut latency: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut plain_latency: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut version = None;
    let mut scores = Vec::with_capacity(runs.len());
    let mut plain = Vec::new();
    for r in runs {
        for (stage, ms) in r.latency {
            latency.entry(stage).or_default().push(ms);
        }
        version = version.or(r.bundle_version);
        if let Some((score, lat)) = r.plain {
            for (stage, ms) in lat {
                plain_latency.entry(stage).or_default().push(ms);
            }
            plain.push(score);
        }
        scores.push(r.score);
    }
    let baseline = (!plain.is_empty()).then(|| {
        Report::new(
            &format!("{name} (plain baseline)"),
            version.clone(),
            rung,
            plain,
            &plain_latency,
        )
    });
    let mut r = Report::new(name, version, rung, scores, &latency);
    r.plain_baseline = baseline.map(Box::new);
    r
}

/// The eval user that reads a BEIR corpus.
pub const BEIR_USER: &str = "eval-reader";
const BEIR_GROUP: &str = "eval-readers";

/// Runs a BEIR retrieval set: nDCG@10, recall@10, recall@100, MRR@10 per query.
pub fn run_beir(
    client: &Client,
    dir: &Path,
    split: &str,
    tokens: &mut Tokens,
    opts: &RunOptions,
    progress: Progress<'_>,
) -> Result<Report, RunError> {
    let set = formats::read_beir(dir, split)?;
    if opts.setup {
        let admin = tokens
            .get("admin")
            .cloned()
            .ok_or_else(|| RunError::MissingToken("admin".into()))?;
        ingest(client, &admin, &set.corpus, opts, progress)?;
        let mut snapshot = json!({"user": BEIR_USER, "groups": [BEIR_GROUP]}).to_string();
        for d in &set.corpus {
            snapshot.push('\n');
            snapshot
                .push_str(&json!({"doc": d.id, "users": [], "groups": [BEIR_GROUP]}).to_string());
        }
        client
            .acl_sync(&admin, &snapshot)
            .map_err(api("sync eval grants"))?;
        issue_tokens(client, &admin, &[BEIR_USER.to_owned()], tokens)?;
    }
    let token = tokens
        .get(BEIR_USER)
        .cloned()
        .ok_or_else(|| RunError::MissingToken(BEIR_USER.into()))?;
    let k = opts.top_k.max(100);
    let runs = parallel(&set.queries, opts.concurrency, "queries", progress, |q| {
        let r = client
            .retrieve(&token, &q.text, k, &opts.mode)
            .map_err(api(format!("query {}", q.id)))?;
        let docs: Vec<&str> = r.results.iter().map(|c| c.doc_id.as_str()).collect();
        let ranked = metrics::dedup_docs(&docs);
        let judged = &set.qrels[&q.id];
        let latency = r
            .timings_ms
            .iter()
            .filter_map(|(s, v)| Some((format!("retrieve.{s}"), v.as_f64()?)))
            .collect();
        Ok(CaseRun {
            score: CaseScore {
                id: q.id.clone(),
                kind: "retrieval".into(),
                phase: "v1".into(),
                ndcg_10: Some(metrics::ndcg_at_k(&ranked, judged, 10)),
                recall_10: Some(metrics::recall_at_k(&ranked, judged, 10)),
                recall_100: Some(metrics::recall_at_k(&ranked, judged, 100)),
                mrr_10: Some(metrics::mrr_at_k(&ranked, judged, 10)),
                answer_hit: None,
                citation_precision: None,
                citation_recall: None,
                abstained: None,
                leaks: Vec::new(),
                error: None,
                retrieved: ranked.iter().take(10).map(|d| (*d).to_owned()).collect(),
                cited: Vec::new(),
                answer: None,
                invented_values: None,
                answer_words: None,
            },
            latency,
            bundle_version: None,
            plain: None,
        })
    })
    .into_iter()
    .collect::<Result<Vec<_>, RunError>>()?;
    let name = dir
        .file_name()
        .map_or("beir".into(), |n| n.to_string_lossy().into_owned());
    Ok(with_version(
        client,
        &token,
        report(&format!("{name}/{split}"), opts.rung, runs),
    ))
}

/// File of a set's follow-up cases (optional; same case format, each with a `history`).
pub const FOLLOW_UPS_FILE: &str = "followups.jsonl";

/// A set's cases: `golden.jsonl`, then `followups.jsonl` when the set has one (case ids
/// unique across both).
fn read_cases(dir: &Path) -> Result<Vec<GoldenCase>, Error> {
    let mut cases = formats::read_golden(&dir.join("golden.jsonl"))?;
    let follow = dir.join(FOLLOW_UPS_FILE);
    if follow.is_file() {
        let more = formats::read_golden(&follow)?;
        let ids: HashSet<&str> = cases.iter().map(|c| c.id.as_str()).collect();
        if let Some(dup) = more.iter().find(|c| ids.contains(c.id.as_str())) {
            return Err(Error::Invalid {
                path: follow,
                message: format!("case id {:?} is also in golden.jsonl", dup.id),
            });
        }
        cases.extend(more);
    }
    Ok(cases)
}

/// Whether a directory holds an end-to-end (bank layout) set rather than a BEIR one.
pub fn is_golden_set(dir: &Path) -> bool {
    dir.join("golden.jsonl").is_file()
}

/// Documents named in the cases of a set (for building small fixture subsets).
pub fn case_doc_ids(cases: &[GoldenCase]) -> HashSet<String> {
    cases
        .iter()
        .flat_map(|c| c.relevant_doc_ids.iter().chain(&c.forbidden_doc_ids))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::sampled;

    #[test]
    fn sampling_picks_exactly_n_cases_spread_over_the_phase() {
        for len in 1..60 {
            for n in 0..=len + 2 {
                let picked: Vec<usize> = (0..len).filter(|&i| sampled(i, n, len)).collect();
                assert_eq!(picked.len(), n.min(len), "len {len} n {n}");
                if n > 0 {
                    assert_eq!(picked[0], 0);
                }
                // No gap between picks is more than one case longer than the even spacing.
                if n >= 2 && n < len {
                    let step = len.div_ceil(n);
                    assert!(picked.windows(2).all(|w| w[1] - w[0] <= step), "{picked:?}");
                }
            }
        }
        // 10 cases, 3 picked: the first, one near a third and one near two thirds.
        let picked: Vec<usize> = (0..10).filter(|&i| sampled(i, 3, 10)).collect();
        assert_eq!(picked, [0, 4, 7]);
    }
}
