//! Ingest from real files: every format, per-document errors that do not stop the batch, and the
//! bank-dev / Cranfield JSONL layouts.

use std::io::BufReader;

use airlock_retrieval::ingest::parse_jsonl;
use airlock_retrieval::{Error, SearchMode, SearchRequest};

use crate::common::{Env, allow, allow_all, shared_dir, test_config};

fn bm25(q: &str, k: usize) -> SearchRequest<'_> {
    SearchRequest {
        query: q,
        k,
        mode: SearchMode::Bm25,
        rescore: false,
        rerank: false,
    }
}

#[test]
fn directory_of_mixed_files_with_bad_ones_ingests_the_good_ones() {
    let env = Env::new();
    let src = env.dir.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(
        src.join("plain.txt"),
        "Overdraft fees are waived for students.",
    )
    .unwrap();
    std::fs::write(
        src.join("sub/guide.md"),
        "# Mortgage guide\n\nFixed rates last five years.",
    )
    .unwrap();
    std::fs::write(
        src.join("page.html"),
        "<html><head><title>x</title><script>alert('pwned')</script></head><body><h1>Branch hours</h1><p>Open Saturdays &amp; Sundays.</p></body></html>",
    )
    .unwrap();
    std::fs::write(
        src.join("batch.jsonl"),
        concat!(
            r#"{"doc_id": "j1", "title": "Card limits", "text": "Daily ATM withdrawal limit", "metadata": {"kind": "faq"}}"#,
            "\n",
            r#"{"doc_id": "j2", "text": ""}"#,
            "\n",
            "{broken\n",
        ),
    )
    .unwrap();
    std::fs::write(src.join("bad.txt"), b"valid start \xff\xfe invalid").unwrap();
    std::fs::write(src.join("empty.md"), "   \n\n ").unwrap();
    std::fs::write(src.join("big.txt"), "word ".repeat(3000)).unwrap();
    std::fs::write(src.join("image.png"), [0x89, b'P', b'N', b'G']).unwrap();

    let mut cfg = test_config();
    cfg.max_document_bytes = 10_000;
    let eng = env.open_bm25(cfg);
    let rep = eng.ingest_path(&src, 2, &mut |_| {}).unwrap();
    let mut stored: Vec<&str> = rep.outcomes.iter().map(|o| o.doc_id.as_str()).collect();
    stored.sort();
    assert_eq!(stored, vec!["j1", "page.html", "plain.txt", "sub/guide.md"]);
    assert_eq!(rep.errors.len(), 6, "{:?}", rep.errors);
    let has = |f: &dyn Fn(&Error) -> bool| rep.errors.iter().any(f);
    assert!(has(
        &|e| matches!(e, Error::InvalidUtf8 { doc_id, offset: 12 } if doc_id == "bad.txt")
    ));
    assert!(has(
        &|e| matches!(e, Error::EmptyDocument { doc_id } if doc_id == "empty.md")
    ));
    assert!(has(
        &|e| matches!(e, Error::EmptyDocument { doc_id } if doc_id == "j2")
    ));
    assert!(has(
        &|e| matches!(e, Error::DocumentTooLarge { doc_id, bytes: 15000, limit: 10000 } if doc_id == "big.txt")
    ));
    assert!(has(&|e| matches!(e, Error::InvalidJsonl { line: 3, .. })));
    assert!(has(&|e| matches!(e, Error::UnsupportedFormat { .. })));
    assert!(rep.errors.iter().all(Error::is_user_error));
    // Messages name the document.
    assert!(
        rep.errors
            .iter()
            .any(|e| e.to_string().contains("bad.txt") && e.to_string().contains("UTF-8"))
    );

    let r = eng.search(&bm25("saturday", 5), &allow_all()).unwrap();
    assert_eq!(r.results[0].doc_id, "page.html");
    assert_eq!(r.results[0].title, "Branch hours");
    assert!(!r.results[0].text.contains("pwned") && !r.results[0].text.contains('<'));
    assert!(
        eng.search(&bm25("alert pwned", 5), &allow_all())
            .unwrap()
            .results
            .is_empty()
    );
    let md = eng.document("sub/guide.md").unwrap().unwrap();
    assert_eq!(md.title, "Mortgage guide");
    assert_eq!(eng.document("j1").unwrap().unwrap().metadata["kind"], "faq");
}

#[test]
fn bank_dev_and_cranfield_jsonl_layouts_ingest() {
    let bank = shared_dir().join("datasets/bank-dev/corpus.jsonl");
    let cran = shared_dir().join("datasets/cranfield/corpus.jsonl");
    let env = Env::new();
    let eng = env.open_bm25(test_config());
    // First 150 bank documents (doc_id layout) and 150 Cranfield ones (_id layout).
    for (path, n) in [(&bank, 150), (&cran, 150)] {
        let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let items: Vec<_> = parse_jsonl("corpus", BufReader::new(f), 1 << 20)
            .into_iter()
            .take(n)
            .collect();
        let rep = eng.ingest_items(items, 64, &mut |_| {}).unwrap();
        assert!(rep.errors.is_empty(), "{:?}", rep.errors);
        assert_eq!(rep.outcomes.len(), n);
    }
    let st = eng.stats();
    assert_eq!(st.live_docs, 300);
    // Bank documents (median ~475 words) need several chunks each.
    assert!(st.live_chunks > 450, "{} chunks", st.live_chunks);
    let r = eng
        .search(&bm25("boundary layer transition", 5), &allow_all())
        .unwrap();
    assert_eq!(r.results.len(), 5);
    assert!(
        r.results
            .iter()
            .all(|x| x.doc_id.chars().all(|c| c.is_ascii_digit())),
        "Cranfield ids"
    );
}

/// The committed extraction fixtures (extract/tests/fixtures/, written by third-party writers).
fn doc_fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../extract/tests/fixtures")
        .join(name)
}

#[test]
fn extracted_files_ingest_with_anchors_and_refusals_per_file() {
    let env = Env::new();
    let src = env.dir.path().join("share");
    std::fs::create_dir_all(&src).unwrap();
    for f in [
        "table-two-pages.pdf",
        "plain.pdf",
        "rates.xlsx",
        "policy.docx",
        "committee.pptx",
        "memo.eml",
        "branches.csv",
        "scanned.pdf",
        "hostile/zip-bomb.docx",
    ] {
        let name = f.rsplit('/').next().unwrap();
        std::fs::copy(doc_fixture(f), src.join(name)).unwrap();
    }
    std::fs::write(src.join("outlook.msg"), [0xD0, 0xCF, 0x11, 0xE0]).unwrap();
    let mut cfg = test_config();
    // Small chunks, so the 70-row rate table must split (and repeat its header).
    cfg.chunk.target_tokens = 120;
    let eng = env.open_bm25(cfg);
    let rep = eng.ingest_path(&src, 4, &mut |_| {}).unwrap();
    let mut stored: Vec<&str> = rep.outcomes.iter().map(|o| o.doc_id.as_str()).collect();
    stored.sort();
    assert_eq!(
        stored,
        [
            "branches.csv",
            "committee.pptx",
            "memo.eml",
            "plain.pdf",
            "policy.docx",
            "rates.xlsx",
            "table-two-pages.pdf"
        ]
    );
    let reasons: Vec<String> = rep.errors.iter().map(ToString::to_string).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons.contains(
            &"scanned.pdf: not extracted: no text layer; OCR is not supported".to_owned()
        )
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("zip-bomb.docx: not extracted: limit exceeded: max_zip_ratio"))
    );
    assert!(
        reasons.contains(
            &"outlook.msg: not extracted: MSG (Outlook) files are not supported: save as .eml"
                .to_owned()
        )
    );
    assert!(rep.errors.iter().all(Error::is_user_error));

    // A figure on page 2 of the PDF: the chunk carries page 2 and the table header.
    let r = eng
        .search(&bm25("\"Premier Bond 68\"", 3), &allow_all())
        .unwrap();
    let hit = &r.results[0];
    assert_eq!(hit.doc_id, "table-two-pages.pdf");
    assert!(
        hit.text
            .starts_with("Product | Term (months) | Rate (%) | Min balance (USD)\n"),
        "{}",
        hit.text
    );
    assert!(hit.text.contains("Premier Bond 68 | 24 | 4.60 | 5,000"));
    let anchors = eng.chunk_anchors(&[hit.chunk_id], &allow_all()).unwrap();
    assert_eq!(anchors[&hit.chunk_id].page, Some(2));
    assert_eq!(anchors[&hit.chunk_id].section, vec!["Deposit rate sheet"]);
    // Every piece of the split table starts with its header row.
    let pieces = eng
        .search(&bm25("\"Fixed Saver\"", 50), &allow_all())
        .unwrap();
    let table: Vec<_> = pieces
        .results
        .iter()
        .filter(|h| h.doc_id == "table-two-pages.pdf")
        .collect();
    assert!(table.len() >= 3, "the table was split: {}", table.len());
    assert!(
        table
            .iter()
            .all(|h| h.text.starts_with("Product | Term (months)"))
    );
    // Spreadsheet anchors: sheet and row range; a slide; a section path.
    let x = eng
        .search(&bm25("Regional credit officer", 10), &allow_all())
        .unwrap();
    let xl = x.results.iter().find(|h| h.doc_id == "rates.xlsx").unwrap();
    let a = &eng.chunk_anchors(&[xl.chunk_id], &allow_all()).unwrap()[&xl.chunk_id];
    assert_eq!(
        (a.sheet.as_deref(), a.rows),
        (Some("Lending limits"), Some((2, 4)))
    );
    let s = eng
        .search(&bm25("non-performing loans", 3), &allow_all())
        .unwrap();
    let a = &eng
        .chunk_anchors(&[s.results[0].chunk_id], &allow_all())
        .unwrap()[&s.results[0].chunk_id];
    assert_eq!(a.slide, Some(2));
    // An anchor is not shown for a document outside the caller's allow set.
    assert!(
        eng.chunk_anchors(&[hit.chunk_id], &crate::common::allow([]))
            .unwrap()
            .is_empty()
    );
    // Text documents have no anchor; re-ingesting the same files changes nothing.
    let again = eng.ingest_path(&src, 4, &mut |_| {}).unwrap();
    assert!(
        again
            .outcomes
            .iter()
            .all(|o| o.status == airlock_retrieval::UpsertStatus::Unchanged)
    );
}

/// Originals: content-addressed and shared, part of the version, given only to `allow`, gone
/// with the last live document naming them, and a file a crash left unnamed (or half written)
/// is swept when the store opens.
#[test]
fn originals_are_shared_served_to_readers_and_swept() {
    use airlock_retrieval::{DocumentInput, Original, sha256_hex};
    let env = Env::new();
    let dir = env.dir.path().join("originals");
    let files = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let doc = |id: &str, bytes: &[u8]| {
        let mut d = DocumentInput::new(id, "", String::from_utf8_lossy(bytes).into_owned());
        d.original = Some(Original::new("text/plain", bytes.to_vec()));
        d
    };
    let (a, b) = (
        b"Overdraft fees are waived.".as_slice(),
        b"Wire cut-off is 4pm.".as_slice(),
    );
    let r = env.open_bm25(test_config());
    let ra = r.upsert_one(doc("a.txt", a)).unwrap();
    let rb = r.upsert_one(doc("b.txt", a)).unwrap();
    assert_eq!(files(), vec![sha256_hex(a)], "one file for two documents");
    // The original is part of the version: the same text from another file is a new version.
    let mut same_text = doc("a.txt", a);
    same_text.original = Some(Original::new("text/markdown", a.to_vec()));
    let ra2 = r.upsert_one(same_text).unwrap();
    assert_ne!(ra.version, ra2.version);
    assert!(r.original("a.txt", &allow([rb.ordinal])).unwrap().is_none());
    let got = r.original("a.txt", &allow([ra.ordinal])).unwrap().unwrap();
    assert_eq!(
        (got.media_type.as_str(), got.len),
        ("text/markdown", a.len() as u64)
    );
    assert_eq!(r.original_digest("a.txt").unwrap(), Some(sha256_hex(a)));
    // Replacing one with another file keeps the shared one for the other document.
    r.upsert_one(doc("a.txt", b)).unwrap();
    assert_eq!(files().len(), 2);
    r.delete("b.txt").unwrap();
    assert_eq!(files(), vec![sha256_hex(b)]);
    assert!(r.original("b.txt", &allow_all()).unwrap().is_none());
    // A crash between the file write and the commit, or inside the write.
    drop(r);
    std::fs::write(dir.join(sha256_hex(b"orphan")), b"orphan").unwrap();
    std::fs::write(dir.join(format!("{}.1.tmp", sha256_hex(b"x"))), b"x").unwrap();
    let r = env.open_bm25(test_config());
    assert_eq!(files(), vec![sha256_hex(b)]);
    r.delete("a.txt").unwrap();
    assert!(files().is_empty());
    r.purge(i64::MAX).unwrap();
    assert!(files().is_empty());
}
