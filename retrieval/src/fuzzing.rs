//! Fuzz harnesses (not API). Each `pub fn` takes arbitrary bytes and must never panic: a panic
//! is a finding. The same bodies run under `cargo fuzz` (`fuzz/fuzz_targets/ingest_*.rs`) and as
//! plain tests over `fuzz/corpus/<target>/`, `fuzz/regressions/<target>/` and proptest mutations
//! of them (the tests below).

use crate::chunker::{ChunkSpan, chunk};
use crate::error::Error;
use crate::ingest::{DocumentInput, SourceFormat, parse_document, parse_jsonl, validate_doc_id};

/// The per-document limit the harnesses pass (the daemon's default upload limit is larger; the
/// checks are the same).
const MAX_BYTES: usize = 1 << 20;

/// Target `ingest_html`: `data` is a document's bytes, extracted as HTML, Markdown and plain
/// text as `POST /v1/documents` and `airlock ingest` do, then chunked.
///
/// Invariants: an extracted document keeps its id, has non-blank text and a title found in that
/// text; a refusal is the documented per-document error (invalid UTF-8 at the first bad byte,
/// empty document, HTML that cannot be rendered); the chunks of the text cover every token in
/// order, each at most `max_tokens` long, overlapping but always advancing.
pub fn ingest_html(data: &[u8]) {
    for format in [
        SourceFormat::Html,
        SourceFormat::Markdown,
        SourceFormat::Text,
    ] {
        match parse_document("fuzz/doc.html", None, data, format, MAX_BYTES) {
            Ok(d) => {
                check_document(&d);
                assert!(d.text.contains(&d.title), "the title comes from the text");
                assert_eq!(d.doc_id, "fuzz/doc.html");
                if format == SourceFormat::Text {
                    assert!(d.title.is_empty());
                    assert_eq!(d.text.as_bytes(), data, "plain text is kept as is");
                }
                check_chunks(&d.text, 1 + data.len() % 40, 0.15);
            }
            Err(Error::InvalidUtf8 { offset, .. }) => {
                let valid = std::str::from_utf8(data).map_err(|e| e.valid_up_to());
                assert_eq!(valid, Err(offset), "InvalidUtf8 names the first bad byte");
            }
            Err(Error::EmptyDocument { .. }) => {}
            Err(Error::InvalidJsonl { line: 0, .. }) if format == SourceFormat::Html => {}
            Err(Error::Extraction {
                code: "limit_exceeded",
                ..
            }) if format == SourceFormat::Html => {}
            Err(Error::DocumentTooLarge { .. }) => assert!(data.len() > MAX_BYTES),
            Err(e) => panic!("unexpected refusal of a document: {e:?}"),
        }
    }
}

/// Target `ingest_jsonl`: `data` is a JSON Lines upload (BEIR `_id` or bank `doc_id` layout).
///
/// Invariants: one result per non-blank line, in order; an accepted document has a valid id,
/// non-blank text and an object for metadata; a refused line is a per-document user error
/// (invalid JSON line, id, UTF-8, empty or oversized document), never a store or I/O error.
pub fn ingest_jsonl(data: &[u8]) {
    let results = parse_jsonl("fuzz.jsonl", data, 4096);
    let non_blank = data
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .count();
    assert_eq!(results.len(), non_blank, "one result per non-blank line");
    for r in results {
        match r {
            Ok(d) => {
                check_document(&d);
                validate_doc_id(&d.doc_id).expect("accepted id is valid");
            }
            Err(
                Error::InvalidJsonl { .. }
                | Error::InvalidDocumentId { .. }
                | Error::InvalidUtf8 { .. }
                | Error::EmptyDocument { .. }
                | Error::DocumentTooLarge { .. },
            ) => {}
            Err(e) => panic!("unexpected refusal of a JSONL line: {e:?}"),
        }
    }
}

/// Target `ingest_sidecar`: `data` is a folder's permissions sidecar (`DIR/.acl.jsonl`,
/// [`crate::sidecar::Sidecar::parse`]), then every line of it is also tried as a path.
///
/// Invariants: a refusal is `InvalidJsonl` naming a line of the input (0: the whole file); an
/// accepted sidecar has at most `MAX_SIDECAR_RULES` rules in line order with valid grants; a
/// glob without `*` or `?` matches itself; the rule found for a path matches it and no later
/// rule does; matching is deterministic; case-sensitive matching is exact matching, and the
/// default case mode answers only when exact and case-insensitive matching give one grant.
pub fn ingest_sidecar(data: &[u8]) {
    use crate::sidecar::{GlobCase, MAX_SIDECAR_RULES, Sidecar, glob_match};
    let lines = data.split(|&b| b == b'\n').count();
    let s = match Sidecar::parse("fuzz/.acl.jsonl", data) {
        Ok(s) => s,
        Err(Error::InvalidJsonl { line, .. }) => {
            assert!(line <= lines, "the error names a line of the input");
            return;
        }
        Err(e) => panic!("unexpected refusal of a sidecar: {e:?}"),
    };
    assert!(s.rules.len() <= MAX_SIDECAR_RULES);
    assert!(s.rules.windows(2).all(|w| w[0].line < w[1].line));
    for r in &s.rules {
        r.grants
            .validate("fuzz")
            .expect("accepted grants are valid");
        if !r.glob.contains(['*', '?']) {
            assert!(glob_match(&r.glob, &r.glob), "{:?} matches itself", r.glob);
        }
    }
    let mut paths: Vec<String> = s.rules.iter().map(|r| r.glob.replace('*', "x")).collect();
    paths.extend(
        data.split(|&b| b == b'\n')
            .take(64)
            .map(|l| String::from_utf8_lossy(l).into_owned()),
    );
    for p in &paths {
        let found = s.rule_for(p);
        assert_eq!(found, s.rule_for(p), "deterministic");
        if let Some(r) = found {
            assert!(glob_match(&r.glob, p));
            assert!(
                s.rules
                    .iter()
                    .filter(|o| o.line > r.line)
                    .all(|o| !glob_match(&o.glob, p)),
                "the last matching rule wins"
            );
        }
        assert_eq!(s.rule_with(p, GlobCase::Sensitive), Ok(found));
        let folded = s
            .rule_with(p, GlobCase::Insensitive)
            .expect("never refused");
        match s.rule_with(p, GlobCase::Refuse) {
            Ok(r) => {
                assert_eq!(r, found);
                assert_eq!(r.map(|r| &r.grants), folded.map(|r| &r.grants));
            }
            Err(e) => {
                assert_eq!(e.exact, found.map(|r| r.line));
                assert_eq!(e.folded, folded.map(|r| r.line));
                assert_ne!(found.map(|r| &r.grants), folded.map(|r| &r.grants));
            }
        }
    }
}

fn check_document(d: &DocumentInput) {
    assert!(!d.text.trim().is_empty(), "accepted text is not blank");
    validate_doc_id(&d.doc_id).expect("accepted id is valid");
}

/// Whitespace tokens as byte spans (the shape `Embed::token_spans` returns).
fn word_spans(text: &str) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                spans.push((s, i));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push((s, text.len()));
    }
    spans
}

fn check_chunks(text: &str, max_tokens: usize, overlap: f32) {
    let spans = word_spans(text);
    let chunks: Vec<ChunkSpan> = chunk(text, &spans, max_tokens, overlap);
    if spans.is_empty() {
        assert!(chunks.is_empty());
        return;
    }
    assert_eq!(
        chunks[0].token_start, 0,
        "the first chunk starts at the first token"
    );
    assert_eq!(
        chunks.last().unwrap().token_end,
        spans.len(),
        "the last ends at the end"
    );
    for c in &chunks {
        assert!(c.token_start < c.token_end && c.token_end - c.token_start <= max_tokens);
        assert_eq!(
            (c.byte_start, c.byte_end),
            (spans[c.token_start].0, spans[c.token_end - 1].1)
        );
        assert!(text.is_char_boundary(c.byte_start) && text.is_char_boundary(c.byte_end));
    }
    for w in chunks.windows(2) {
        assert!(w[1].token_start > w[0].token_start, "chunks advance");
        assert!(w[1].token_start <= w[0].token_end, "no token is skipped");
    }
}

/// Target `vector_graph_dump`: `data` is the vector index's graph dump (`graph-<n>.flat`,
/// `vector::flat::FlatGraph::read_from`, read with dimension 8). In an index it is read only
/// after its SHA-256 matched the meta, but a damaged disk or a hand-restored directory can hand
/// the parser anything.
///
/// Invariants: a refusal is an error, never a panic or an allocation the input's size does not
/// bound; an accepted dump passes `check`, writes back byte-identical (one encoding per graph),
/// and a search over it returns at most `ef` distinct points of the graph.
pub fn vector_graph_dump(data: &[u8]) {
    use crate::vector::flat::FlatGraph;
    const DIM: usize = 8;
    let Ok(g) = FlatGraph::read_from(data, DIM) else {
        return;
    };
    g.check().expect("an accepted dump is well-formed");
    let mut back = Vec::new();
    g.write_to(&mut back).expect("write to a Vec");
    assert_eq!(back, data, "an accepted dump writes back identical");
    let rows: Vec<i8> = (0..g.len() * DIM).map(|i| (i % 7) as i8 - 3).collect();
    let hits = g.search(&rows, &[1; DIM], 10);
    assert!(hits.len() <= 10.min(g.len()), "at most ef points");
    let mut ids: Vec<u32> = hits.iter().map(|h| h.0).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), hits.len(), "distinct points");
    assert!(
        ids.iter().all(|&i| (i as usize) < g.len()),
        "points of the graph"
    );
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingest_html_corpus_and_mutations() {
        replay::run("ingest_html", &[], 1500, ingest_html);
    }

    #[test]
    fn ingest_sidecar_corpus_and_mutations() {
        replay::run("ingest_sidecar", &[], 3000, ingest_sidecar);
    }

    #[test]
    fn ingest_jsonl_corpus_and_mutations() {
        replay::run("ingest_jsonl", &[], 3000, ingest_jsonl);
    }

    #[test]
    fn vector_graph_dump_corpus_and_mutations() {
        use crate::vector::flat::FlatGraph;
        // Fresh seeds: a small graph's dump (format 1) and its compacted copy's (format 2).
        let dim = 8;
        let rows: Vec<i8> = (0..60 * dim).map(|i| ((i * 37) % 255) as i8).collect();
        let mut g = FlatGraph::new(dim, 4, 8);
        g.reserve(60);
        g.insert(&rows, 0..60);
        let keep: Vec<bool> = (0..60).map(|s| s % 5 != 0).collect();
        let c = g.compacted(&rows, &keep);
        let mut seeds = vec![Vec::new(), Vec::new()];
        g.write_to(&mut seeds[0]).unwrap();
        c.write_to(&mut seeds[1]).unwrap();
        replay::run("vector_graph_dump", &seeds, 3000, vector_graph_dump);
    }
}
