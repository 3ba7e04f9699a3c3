//! Fuzz harnesses (not API). Each `pub fn` takes arbitrary bytes and must never panic: a panic
//! is a finding. The same body runs under `cargo fuzz` (`fuzz/fuzz_targets/chat_body.rs`, when
//! that crate is built with the `appliance` feature) and as a plain test over
//! `fuzz/corpus/chat_body/`, `fuzz/regressions/chat_body/` and proptest mutations of them.

use crate::error::ApiError;
use crate::extract::parse_json;
use crate::openai::ChatRequest;
use crate::routes::chat::{CITATION_SNIPPET_BYTES, MAX_COMPLETION_TOKENS, validate};
use airlock_rag::prompt::{self, Role};

/// Target `chat_body`: `data` is a `POST /v1/chat/completions` body. It goes through the same
/// JSON parse as the route's extractor ([`parse_json`]), the route's validation, then the pure
/// text functions the request path runs on the client's words: the retrieval query, question
/// facets, focus and name terms, prompt sanitising and building, citation finding and snippets.
///
/// Invariants: every refusal is `invalid_request` (HTTP 400), never an internal error; accepted
/// sampling parameters are within the documented ranges; sanitised text holds no chat-template
/// control sequence or source fence; a citation names only existing sources, ascending; a
/// snippet is within its byte budget.
pub fn chat_body(data: &[u8]) {
    let req: ChatRequest = match parse_json(data) {
        Ok(r) => r,
        Err(e) => {
            assert!(matches!(e, ApiError::InvalidRequest(_)), "{e:?}");
            return;
        }
    };
    let params = match validate(&req, 256) {
        Ok(p) => p,
        Err(e) => {
            assert!(matches!(e, ApiError::InvalidRequest(_)), "{e:?}");
            return;
        }
    };
    assert!((1..=MAX_COMPLETION_TOKENS as usize).contains(&params.max_tokens));
    assert!((0.0..=2.0).contains(&params.temperature));
    assert!(params.top_p > 0.0 && params.top_p <= 1.0);
    assert!(params.stop_strings.len() <= 4);

    let conversation: Vec<(Role, String)> = req
        .messages
        .iter()
        .map(|m| (Role::from_openai(&m.role), m.content.clone()))
        .collect();
    let query = prompt::last_user_text(&conversation).expect("validated: a user message");
    let _ = airlock_rag::facets::facets(query);
    let _ = airlock_rag::focus::question_terms(query);
    let _ = airlock_rag::focus::question_pairs(query);
    let _ = airlock_rag::focus::years(query);
    let _ = airlock_rag::cite::name_runs(query);
    // Terms of art: each one a token of the question, its pieces and spellings bounded.
    let terms = airlock_rag::terms::terms_of_art(query, |w| Some(w.len() % 5));
    for t in &terms {
        assert!(query.contains(t.as_str()), "term {t:?} not in the question");
        for p in airlock_rag::terms::pieces_of(t) {
            assert!(airlock_rag::terms::spellings(&p).len() <= 8);
        }
    }
    let _ = airlock_rag::terms::unknown(&terms, |w| Some(w.len() % 2 == 0));

    // The other messages stand in for retrieved sources and the model's answer.
    let sources: Vec<&str> = req.messages.iter().map(|m| m.content.as_str()).collect();
    let _ = airlock_rag::cite::unmatched_names(query, &sources);
    for s in &sources {
        let _ = airlock_rag::cite::names_stand_alone(query, s);
        let clean = prompt::sanitize(s);
        for bad in ["<|", "|>", "<s>", "</s>", "[INST]", "[/INST]"] {
            assert!(!clean.contains(bad), "sanitised text holds {bad:?}");
        }
        assert!(!clean.to_ascii_lowercase().contains("<source"));
        assert!(!clean.to_ascii_lowercase().contains("</source"));
        let snip = prompt::snippet(s, CITATION_SNIPPET_BYTES);
        assert!(snip.len() <= CITATION_SNIPPET_BYTES + '…'.len_utf8());
        // The supporting passage: a substring of an excerpt within its budget (plus its marks).
        let e = airlock_rag::passage::excerpt(s, query, CITATION_SNIPPET_BYTES);
        assert!(e.snippet.len() <= CITATION_SNIPPET_BYTES + 8);
        if let Some(p) = &e.passage {
            assert!(!p.is_empty() && e.snippet.contains(p.as_str()));
        }
    }
    let candidates: Vec<airlock_rag::focus::Candidate<'_>> = sources
        .iter()
        .enumerate()
        .map(|(i, text)| airlock_rag::focus::Candidate {
            doc_id: if i % 2 == 0 { "a" } else { "b" },
            title: "",
            text,
        })
        .collect();
    assert_eq!(
        airlock_rag::focus::keep(query, &candidates, 0.5).len(),
        candidates.len()
    );
    if let Some(keep) = airlock_rag::focus::naming_all(query, &candidates) {
        assert_eq!(keep.len(), candidates.len());
    }
    let answer = sources.last().copied().unwrap_or_default();
    let cited = airlock_rag::cite::cited(answer, query, &sources);
    assert!(cited.sources.windows(2).all(|w| w[0] < w[1]), "ascending");
    assert!(
        cited
            .sources
            .iter()
            .all(|n| (1..=sources.len()).contains(n)),
        "{cited:?} names a source that does not exist"
    );
    let srcs: Vec<prompt::Source<'_>> = sources
        .iter()
        .map(|text| prompt::Source { title: "t", text })
        .collect();
    let built = prompt::build(&conversation, Some(&srcs));
    assert!(!built.is_empty());
}

/// Target `rack_stream`: `data` is what an upstream engine (the bank's inference rack) sent on
/// a chat stream. It is cut into SSE events as the remote generator cuts it and each event is
/// parsed. Invariants: each event ends inside the buffer and after its start; a parsed chunk's
/// text piece is never empty; nothing panics on any byte string (the rack is outside data).
pub fn rack_stream(data: &[u8]) {
    use airlock_serving::remote::stream::{Parsed, event_end, parse_event};
    let mut rest = data;
    while let Some(end) = event_end(rest) {
        assert!(
            end > 0 && end <= rest.len(),
            "event end {end} of {}",
            rest.len()
        );
        if let Parsed::Chunk { piece: Some(p), .. } = parse_event(&rest[..end]) {
            assert!(!p.is_empty());
        }
        rest = &rest[end..];
    }
    let _ = parse_event(rest);
}

/// Target `rack_metrics`: `data` is what an engine's Prometheus `/metrics` endpoint sent (the
/// rack's vLLM or llama.cpp server), read as admission reads it for each engine kind.
/// Invariants: no panic on any bytes; a load read is never negative or NaN; the same bytes give
/// the same load, also with a comment line appended.
pub fn rack_metrics(data: &[u8]) {
    use airlock_serving::remote::engine_metrics::{EngineKind, parse};
    for kind in [EngineKind::Vllm, EngineKind::LlamaCpp] {
        for model in ["smollm2-upstream", ""] {
            let load = parse(data, kind, model);
            if let Some(l) = load {
                assert!(l.waiting >= 0.0, "{l:?}");
                assert!(l.running.is_none_or(|r| r >= 0.0), "{l:?}");
            }
            let mut more = data.to_vec();
            more.extend_from_slice(b"\n# HELP vllm:num_requests_waiting x\n");
            assert_eq!(parse(&more, kind, model), load);
        }
    }
}

/// The fixed key the `answer_receipt` target verifies against.
pub fn receipt_key() -> airlock_signing::KeyPair {
    airlock_signing::KeyPair::from_seed([0x52; 32])
}

/// Target `answer_receipt`: `data` is read as a signed answer receipt (`airlock receipt
/// verify`, the file an auditor receives). Invariant: a file that verifies is exactly what
/// signing its receipt again writes (canonical form, deterministic Ed25519), so no other byte
/// string can pass for it; anything else is refused with a `ReceiptError`, never a panic.
pub fn answer_receipt(data: &[u8]) {
    let key = receipt_key();
    if let Ok(r) = airlock_evidence::receipts::verify(data, &key.public()) {
        assert_eq!(
            airlock_evidence::receipts::sign(&r, &key),
            data,
            "a verified receipt is canonical"
        );
    }
}

/// A valid receipt signed by [`receipt_key`] (the generated seed of `answer_receipt`).
pub fn receipt_seed() -> Vec<u8> {
    use airlock_evidence::receipts::{
        BundleRef, DocRef, ModelRef, RECEIPT_FORMAT, Receipt, sha256,
    };
    let doc = |n: usize, id: &str| DocRef {
        n,
        doc_id: id.into(),
        version: Some(sha256(id.as_bytes())),
        chunk_id: n as u32 * 7,
    };
    let r = Receipt {
        format: RECEIPT_FORMAT.into(),
        receipt_id: "rcpt-0123456789abcdef0123456789abcdef".into(),
        appliance_id: receipt_key().key_id().as_str().into(),
        request_id: "req-1".into(),
        user_id: "u017".into(),
        served_at: "2026-05-01T00:00:00.000000Z".into(),
        completed_at: Some("2026-05-01T00:00:02.500000Z".into()),
        outcome: "answered".into(),
        bundle: BundleRef {
            version: "1.2.0".into(),
            digest: Some(sha256(b"manifest")),
        },
        model: ModelRef {
            alias: "airlock-large".into(),
            model_id: "qwen".into(),
            file_digest: Some(sha256(b"weights")),
            served_by: "local".into(),
        },
        index_generation: 4,
        acl_state_seq: 17,
        prompt_sha256: Some(sha256(b"prompt")),
        shown: vec![doc(1, "doc-a"), doc(2, "doc-b")],
        cited: Some(vec![doc(2, "doc-b")]),
        cited_by: Some("markers".into()),
        finish: Some("stop".into()),
        audit_seq: vec![40, 44],
    };
    airlock_evidence::receipts::sign(&r, &receipt_key())
}

/// Target `backup_archive`: `data` is a backup archive (`airlock restore --from FILE`), read as
/// the restore reads it into a fresh staging directory; and, so that mutations reach the tar
/// and manifest checks behind the compression, `data` is also taken as the uncompressed tar
/// stream, compressed and read. Invariants: an accepted archive left exactly the manifest's
/// files there, each with its size; a refused one is always `ArchiveError::Corrupt` (naming an
/// entry), never an I/O error or a panic, whatever the bytes.
pub fn backup_archive(data: &[u8]) {
    backup_read(data);
    if let Ok(z) = zstd::stream::encode_all(data, 1) {
        backup_read(&z);
    }
}

fn backup_read(data: &[u8]) {
    use crate::backup::archive::{ArchiveError, read};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "airlock-fuzz-backup-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let outcome = read(data, &dir);
    let mut found = Vec::new();
    let mut stack = vec![dir.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("list scratch") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let len = std::fs::metadata(&p).expect("stat").len();
                let rel = p
                    .strip_prefix(&dir)
                    .expect("beneath")
                    .to_string_lossy()
                    .into_owned();
                found.push((rel, len));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    found.sort();
    match outcome {
        Ok(m) => {
            let mut want: Vec<(String, u64)> =
                m.files.iter().map(|f| (f.path.clone(), f.size)).collect();
            want.sort();
            assert_eq!(found, want, "an accepted archive wrote other files");
        }
        Err(e) => assert!(matches!(e, ArchiveError::Corrupt { .. }), "{e:?}"),
    }
}

/// A small valid backup archive (the `backup_archive` seed).
pub fn backup_seed() -> Vec<u8> {
    use crate::backup::archive::{FORMAT_VERSION, FileEntry, Manifest, Source, hash_file, write};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "airlock-fuzz-seed-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    let mut sources = Vec::new();
    for (path, text) in [
        ("airlock.db", &b"SQLite format 3\0 pages"[..]),
        ("index/0/bm25/meta.json", &b"{\"segments\":[]}"[..]),
        ("keys/trusted.json", &b"{}"[..]),
    ] {
        let from = dir.join(path.replace('/', "_"));
        std::fs::write(&from, text).expect("seed file");
        let (sha256, size) = hash_file(&from).expect("hash");
        sources.push(Source {
            entry: FileEntry {
                path: path.into(),
                size,
                mode: 0o644,
                sha256,
            },
            from,
        });
    }
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        created: "2026-12-02T00:00:00Z".into(),
        airlock_version: "0.1.0".into(),
        index_generation: 0,
        bundle: Some("1.0.0".into()),
        includes_keys: false,
        includes_bundles: false,
        files: sources.iter().map(|s| s.entry.clone()).collect(),
    };
    let out = dir.join("seed.tar.zst");
    write(&out, &manifest, &sources).expect("seed archive");
    let bytes = std::fs::read(&out).expect("read seed");
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// Target `console_report`: `data` is a `report.json` in the configured eval reports directory,
/// as the operator console reads it (`routes::admin::report_aggregates`). Invariants: no panic
/// on any bytes; what is kept holds only the aggregate keys (never `cases`), each as the file
/// has it; a JSON object is always accepted.
pub fn console_report(data: &[u8]) {
    use crate::routes::admin::{REPORT_KEYS, report_aggregates};
    let parsed = serde_json::from_slice::<serde_json::Value>(data).ok();
    match (report_aggregates(data), parsed) {
        (Some(kept), Some(serde_json::Value::Object(all))) => {
            for (k, v) in &kept {
                assert!(REPORT_KEYS.contains(&k.as_str()), "kept {k}");
                assert_eq!(all.get(k), Some(v));
            }
            assert!(!kept.contains_key("cases"));
        }
        (None, Some(serde_json::Value::Object(_))) => panic!("a JSON object was refused"),
        (Some(_), _) => panic!("accepted bytes that are not a JSON object"),
        (None, _) => {}
    }
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_body_corpus_and_mutations() {
        replay::run("chat_body", &[], 3000, chat_body);
    }

    #[test]
    fn answer_receipt_seed_and_mutations() {
        let seed = receipt_seed();
        answer_receipt(&seed);
        assert!(airlock_evidence::receipts::verify(&seed, &receipt_key().public()).is_ok());
        replay::run("answer_receipt", &[seed], 1000, answer_receipt);
    }

    #[test]
    fn backup_archive_seeds_and_mutations() {
        let seed = backup_seed();
        // The seed itself is accepted (the harness's success branch is reached).
        let dir = tempfile::tempdir().unwrap();
        crate::backup::archive::read(&seed[..], dir.path()).unwrap();
        let plain = zstd::stream::decode_all(&seed[..]).unwrap();
        replay::run("backup_archive", &[seed, plain], 500, backup_archive);
    }

    #[test]
    fn rack_stream_seeds_and_mutations() {
        let seed = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
: ping\r\n\r\ndata: {\"error\":{\"message\":\"x\"}}\n\n\
data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":3}}\n\n\
data: [DONE]\n\n";
        replay::run("rack_stream", &[seed.to_vec()], 2000, rack_stream);
    }

    #[test]
    fn console_report_seeds_and_mutations() {
        let seed = br#"{"set": "bank-dev", "bundle_version": "1.0.0", "rung": null,
"overall": {"cases": 2, "leaking_cases": 0, "failed_cases": 0, "metrics": {"recall_10": {"mean": 0.5, "lo": 0.1, "hi": 0.9}}},
"per_kind": {"injection": {"cases": 2, "leaking_cases": 0, "metrics": {}}}, "per_phase": {}, "latency_ms": {"retrieval_total": {"p50": 4.0}},
"cases": [{"id": "c1", "query": "q", "answer": "a"}]}"#;
        let kept = crate::routes::admin::report_aggregates(seed).unwrap();
        assert_eq!(kept.len(), 7, "{kept:?}");
        replay::run("console_report", &[seed.to_vec()], 2000, console_report);
    }

    #[test]
    fn rack_metrics_seeds_and_mutations() {
        let vllm = b"# HELP vllm:num_requests_waiting Number of requests waiting.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"smollm2-upstream\"} 3.0\n\
vllm:num_requests_running{engine=\"0\",model_name=\"smollm2-upstream\"} 12.0\n\
vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"x\\\"y\"} 7 1700000000\n";
        let llamacpp = b"# TYPE llamacpp:requests_processing gauge\n\
llamacpp:requests_processing 1\nllamacpp:requests_deferred 4\n";
        replay::run(
            "rack_metrics",
            &[vllm.to_vec(), llamacpp.to_vec()],
            2000,
            rack_metrics,
        );
    }
}
