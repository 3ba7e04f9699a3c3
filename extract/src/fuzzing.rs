//! Fuzz harnesses (not API). Each `pub fn` takes arbitrary bytes and must never panic: a panic
//! is a finding. The same bodies run under `cargo fuzz` (`fuzz/fuzz_targets/extract_*.rs`) and
//! as plain tests over `fuzz/corpus/<target>/`, `fuzz/regressions/<target>/` and proptest
//! mutations of them (the tests below).

use crate::{Block, BlockKind, Extracted, Format, Limits, Refusal, extract};

/// Small limits, so a mutated input that would pass the real limits only slowly still runs fast.
fn limits() -> Limits {
    Limits {
        max_file_bytes: 4 << 20,
        max_pages: 50,
        max_sheets: 20,
        max_slides: 50,
        max_cells: 50_000,
        max_text_bytes: 4 << 20,
        max_zip_entries: 500,
        max_zip_bytes: 32 << 20,
        max_stream_bytes: 16 << 20,
        ..Limits::default()
    }
}

fn check(data: &[u8], format: Format, r: Result<Extracted, Refusal>) {
    let limits = limits();
    // Deterministic: the same bytes give the same answer.
    assert_eq!(
        extract(data, format, &limits),
        r,
        "extraction is deterministic"
    );
    match r {
        Ok(x) => {
            assert!(!x.blocks.is_empty(), "an accepted file has blocks");
            assert!(x.blocks.iter().any(|b| !b.text.trim().is_empty()));
            assert!(
                x.text_bytes() as u64 <= limits.max_text_bytes,
                "text within the limit"
            );
            for b in &x.blocks {
                check_block(b);
            }
            if format == Format::Pdf {
                assert!(x.units as u64 <= u64::from(limits.max_pages));
                assert!(
                    x.blocks
                        .iter()
                        .all(|b| b.anchor.page.is_some_and(|p| p >= 1 && p <= x.units))
                );
            }
        }
        Err(Refusal::LimitExceeded { value, limit, .. }) => {
            assert!(value > limit, "{value} > {limit}")
        }
        Err(Refusal::Malformed { reason, .. }) => assert!(reason.len() <= 300),
        Err(_) => {}
    }
}

fn check_block(b: &Block) {
    assert!(!b.text.trim().is_empty(), "no blank blocks");
    if let BlockKind::Table { header_rows } = b.kind {
        assert!(header_rows <= 1);
        assert!(!b.text.ends_with('\n'));
    }
    if let Some((a, z)) = b.anchor.rows {
        assert!(a >= 1 && a <= z, "row range {a}..{z}");
    }
    if let Some(s) = b.anchor.slide {
        assert!(s >= 1);
    }
}

/// Target `extract_pdf`.
pub fn extract_pdf(data: &[u8]) {
    check(data, Format::Pdf, extract(data, Format::Pdf, &limits()));
}

/// Target `extract_docx`.
pub fn extract_docx(data: &[u8]) {
    check(data, Format::Docx, extract(data, Format::Docx, &limits()));
}

/// Target `extract_xlsx`.
pub fn extract_xlsx(data: &[u8]) {
    check(data, Format::Xlsx, extract(data, Format::Xlsx, &limits()));
}

/// Target `extract_pptx`.
pub fn extract_pptx(data: &[u8]) {
    check(data, Format::Pptx, extract(data, Format::Pptx, &limits()));
}

/// Target `extract_eml`.
pub fn extract_eml(data: &[u8]) {
    check(data, Format::Eml, extract(data, Format::Eml, &limits()));
}

/// Target `extract_csv`: CSV, and the same bytes as Markdown and HTML.
pub fn extract_csv(data: &[u8]) {
    for f in [Format::Csv, Format::Markdown, Format::Html] {
        check(data, f, extract(data, f, &limits()));
    }
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed test files of extract/tests/fixtures/ whose name ends in `ext`, as seeds.
    fn fixtures(ext: &str) -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let mut out = Vec::new();
        for d in [dir.clone(), dir.join("hostile")] {
            let mut files: Vec<_> = std::fs::read_dir(&d)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .collect();
            files.sort();
            for f in files {
                if f.extension().is_some_and(|e| e == ext) {
                    out.push(std::fs::read(&f).unwrap());
                }
            }
        }
        out
    }

    #[test]
    fn extract_pdf_corpus_and_mutations() {
        replay::run("extract_pdf", &fixtures("pdf"), 300, extract_pdf);
    }

    #[test]
    fn extract_docx_corpus_and_mutations() {
        replay::run("extract_docx", &fixtures("docx"), 200, extract_docx);
    }

    #[test]
    fn extract_xlsx_corpus_and_mutations() {
        replay::run("extract_xlsx", &fixtures("xlsx"), 200, extract_xlsx);
    }

    #[test]
    fn extract_pptx_corpus_and_mutations() {
        replay::run("extract_pptx", &fixtures("pptx"), 150, extract_pptx);
    }

    #[test]
    fn extract_eml_corpus_and_mutations() {
        replay::run("extract_eml", &fixtures("eml"), 300, extract_eml);
    }

    #[test]
    fn extract_csv_corpus_and_mutations() {
        replay::run("extract_csv", &fixtures("csv"), 1000, extract_csv);
    }
}
