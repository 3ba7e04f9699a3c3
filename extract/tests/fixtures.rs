//! The committed files of tests/fixtures/ (written by scripts/gen-doc-fixtures.py with
//! reportlab, python-docx, XlsxWriter, python-pptx and the stdlib `email`; the hostile ones
//! assembled by hand): what is read from each, and every limit refusing its hostile file.

use std::path::Path;

use airlock_extract::{Block, BlockKind, Extracted, Format, Limits, Refusal, extract};

mod generated;

fn read(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn format_of(name: &str) -> Format {
    Format::from_extension(name.rsplit_once('.').unwrap().1).unwrap()
}

fn ok(name: &str) -> Extracted {
    extract(&read(name), format_of(name), &Limits::default())
        .unwrap_or_else(|e| panic!("{name} refused: {e}"))
}

fn refused(name: &str, limits: &Limits) -> Refusal {
    match extract(&read(name), format_of(name), limits) {
        Ok(x) => panic!("{name} accepted: {} blocks", x.blocks.len()),
        Err(e) => e,
    }
}

fn find<'a>(x: &'a Extracted, needle: &str) -> &'a Block {
    x.blocks
        .iter()
        .find(|b| b.text.contains(needle))
        .unwrap_or_else(|| panic!("no block contains {needle:?}"))
}

fn limit_name(r: &Refusal) -> &'static str {
    match r {
        Refusal::LimitExceeded { what, .. } => what,
        other => panic!("not a limit refusal: {other:?}"),
    }
}

#[test]
fn plain_pdf_pages_headings_and_hyphenation() {
    let x = ok("plain.pdf");
    assert_eq!(x.units, 2);
    assert_eq!(
        x.title.as_deref(),
        Some("SextantBridge Resilience and Recovery Profile")
    );
    // The generator broke "environment" and "managers" across lines with a hyphen.
    let b = find(&x, "restored in a test environment at least quarterly");
    assert_eq!(b.anchor.page, Some(1));
    assert_eq!(
        b.anchor.section,
        vec![
            "SextantBridge Resilience and Recovery Profile",
            "Service description"
        ]
    );
    assert!(
        find(&x, "Line managers should keep")
            .text
            .contains("Line managers")
    );
    let testing = find(&x, "Restore tests run at least quarterly");
    assert_eq!(testing.anchor.page, Some(2));
    assert_eq!(
        testing.anchor.section.last().map(String::as_str),
        Some("Testing")
    );
    assert!(
        x.blocks
            .iter()
            .any(|b| b.kind == BlockKind::Heading(2) && b.text == "Revision history")
    );
}

#[test]
fn two_column_pdf_reads_column_by_column() {
    let x = ok("two-columns.pdf");
    let text = x.to_text();
    let left_end = text
        .find("Material changes to this policy are communicated")
        .expect("left column");
    let right_start = text
        .find("Preservation Notice: Wolfhall Telecom")
        .expect("right column");
    let left_start = text
        .find("Joining the Halcyon Premier Group Personal Pension")
        .unwrap();
    assert!(
        left_start < left_end && left_end < right_start,
        "left column whole before the right"
    );
    // No line mixes the two columns.
    assert!(
        !text.contains("salary. Probation reviews take place at three and six months. You are")
    );
}

#[test]
fn pdf_table_spanning_pages_keeps_rows_and_drops_running_header_and_footer() {
    let x = ok("table-two-pages.pdf");
    let tables: Vec<&Block> = x
        .blocks
        .iter()
        .filter(|b| matches!(b.kind, BlockKind::Table { .. }))
        .collect();
    assert_eq!(tables.len(), 2, "one table piece per page");
    let header = "Product | Term (months) | Rate (%) | Min balance (USD)";
    assert_eq!(tables[0].table_header(), Some(header));
    assert_eq!(
        tables[1].table_header(),
        Some(header),
        "the repeated header row is kept"
    );
    assert_eq!(tables[0].anchor.page, Some(1));
    assert_eq!(tables[1].anchor.page, Some(2));
    let rows: usize = tables.iter().map(|t| t.text.lines().count() - 1).sum();
    assert_eq!(rows, 70, "every data row once");
    assert!(
        tables[0]
            .text
            .contains("\nFixed Saver 1 | 3 | 1.25 | 1,000\n")
    );
    assert!(x.to_text().contains("Premier Bond 68 | 24 | 4.60 | 5,000"));
    let all = x.to_text();
    assert!(!all.contains("Internal use only"), "footer dropped");
    assert!(
        !all.contains("Treasury - Deposit rate sheet"),
        "running header dropped"
    );
    assert!(all.contains("Rates are reviewed monthly"));
}

#[test]
fn scanned_and_encrypted_pdfs_are_refused_with_reasons() {
    let l = Limits::default();
    assert_eq!(refused("scanned.pdf", &l), Refusal::NoTextLayer);
    assert_eq!(
        refused("scanned.pdf", &l).to_string(),
        "no text layer; OCR is not supported"
    );
    assert_eq!(refused("encrypted.pdf", &l), Refusal::Encrypted);
    assert_eq!(
        refused("encrypted.pdf", &l).to_string(),
        "encrypted or password-protected"
    );
    // A truncated file: no text, no image.
    assert!(matches!(
        refused("hostile/truncated.pdf", &l),
        Refusal::Empty | Refusal::Malformed { .. }
    ));
}

#[test]
fn xlsx_sheets_header_rows_and_cached_formula_values() {
    let x = ok("rates.xlsx");
    assert_eq!(x.title.as_deref(), Some("Rate sheet June 2024"));
    assert_eq!(x.units, 2);
    let t = find(&x, "Fixed Saver 12m");
    assert_eq!(
        t.table_header(),
        Some("Product | Term (months) | Rate (%) | Interest on 10,000 (USD)")
    );
    assert!(
        t.text.contains("Fixed Saver 12m | 12 | 4.1 | 410"),
        "cached formula value: {}",
        t.text
    );
    assert_eq!(t.anchor.sheet.as_deref(), Some("Deposit rates"));
    assert_eq!(t.anchor.rows, Some((2, 6)));
    assert_eq!(t.anchor.section, vec!["Deposit rates"]);
    let l = find(&x, "Regional credit officer");
    assert_eq!(l.anchor.sheet.as_deref(), Some("Lending limits"));
}

#[test]
fn xlsx_title_rows_above_a_table_are_headings_not_its_header() {
    let x = ok("titled.xlsx");
    let t = find(&x, "Main vault | 834500");
    assert_eq!(t.table_header(), Some("Limit | Amount (USD)"));
    assert_eq!(
        t.anchor.section,
        vec![
            "Limits",
            "Bradwell Station Road branch limits",
            "Approved by Retail Operations, February 2024"
        ],
        "the caption travels with every chunk of the table"
    );
    assert_eq!(t.anchor.rows, Some((5, 6)));
    let caption = find(&x, "Bradwell Station Road branch limits");
    assert_eq!(caption.kind, BlockKind::Heading(2));
    assert_eq!(caption.anchor.rows, Some((1, 1)));
    // A sheet of one column has no title row: every line is the table's.
    let codes = find(&x, "BR-02");
    assert_eq!(codes.table_header(), Some("BR-01"));
    assert_eq!(codes.anchor.section, vec!["Codes"]);
}

#[test]
fn docx_headings_lists_and_tables() {
    let x = ok("policy.docx");
    assert_eq!(x.title.as_deref(), Some("Credit Limits Policy"));
    let t = find(&x, "Corporate | 25,000,000 | Credit Committee");
    assert_eq!(t.kind, BlockKind::Table { header_rows: 1 });
    assert_eq!(t.table_header(), Some("Segment | Limit (USD) | Approver"));
    assert_eq!(
        t.anchor.section,
        vec!["Credit Limits Policy", "4 Lending", "4.2 Limits"]
    );
    let bullet = find(&x, "Exceptions expire after 90 days.");
    assert_eq!(bullet.kind, BlockKind::ListItem);
    assert_eq!(bullet.text, "- Exceptions expire after 90 days.");
    assert_eq!(
        bullet.anchor.section.last().map(String::as_str),
        Some("4.3 Exceptions")
    );
    assert_eq!(
        find(&x, "Attach the credit memo.").text,
        "2. Attach the credit memo."
    );
}

#[test]
fn pptx_one_section_per_slide_with_notes() {
    let x = ok("committee.pptx");
    assert_eq!(x.units, 3);
    let b = find(&x, "Non-performing loans at 1.8%");
    assert_eq!(b.anchor.slide, Some(2));
    assert_eq!(b.anchor.section, vec!["Portfolio quality"]);
    let n = find(&x, "Wolfhall needs two approvers");
    assert_eq!(n.anchor.slide, Some(3));
    assert_eq!(n.anchor.section, vec!["Limit requests", "Notes"]);
}

#[test]
fn eml_headers_body_and_pdf_attachment() {
    let x = ok("memo.eml");
    assert_eq!(
        x.title.as_deref(),
        Some("Halcyon Premier Personal Loan: Key Facts")
    );
    let h = find(&x, "From: Uma Bauer <uma.bauer@halcyon.example>");
    assert!(
        h.text
            .contains("To: Credit Risk <credit.risk@halcyon.example>")
    );
    assert!(h.text.contains("Date: 2024-05-27T09:30:00Z"));
    find(&x, "Minimum opening deposit  USD 4,900");
    let a = find(&x, "Backups are encrypted at rest");
    assert_eq!(
        a.anchor.page,
        Some(1),
        "the attachment keeps its page anchors"
    );
    assert_eq!(
        &a.anchor.section[..2],
        ["Halcyon Premier Personal Loan: Key Facts", "memo.pdf"]
    );
}

#[test]
fn csv_header_and_rows() {
    let x = ok("branches.csv");
    let t = &x.blocks[0];
    assert_eq!(
        t.table_header(),
        Some("Branch | City | Deposits (USD m) | Loans (USD m)")
    );
    assert!(t.text.contains("Kings Cross | London | 1,204.1 | 997.3"));
    assert_eq!(t.anchor.rows, Some((2, 5)));
}

// --- limits, each with its hostile file ------------------------------------------------------

#[test]
fn zip_bomb_is_refused_by_the_expansion_ratio() {
    let r = refused("hostile/zip-bomb.docx", &Limits::default());
    assert_eq!(limit_name(&r), "max_zip_ratio");
    // With the ratio lifted, the absolute cap still holds.
    let l = Limits {
        max_zip_ratio: 100_000,
        max_zip_bytes: 8 << 20,
        ..Limits::default()
    };
    assert_eq!(
        limit_name(&refused("hostile/zip-bomb.docx", &l)),
        "max_zip_bytes"
    );
}

#[test]
fn zip_entry_count_is_limited() {
    let l = Limits {
        max_zip_entries: 100,
        ..Limits::default()
    };
    let r = refused("hostile/many-entries.docx", &l);
    assert_eq!(r.to_string(), "limit exceeded: max_zip_entries (303 > 100)");
    ok("hostile/many-entries.docx");
}

#[test]
fn billion_laughs_is_refused_without_expanding_anything() {
    let r = refused("hostile/billion-laughs.xlsx", &Limits::default());
    assert!(r.to_string().contains("DTD"), "{r}");
}

#[test]
fn deep_xml_is_refused() {
    let r = refused("hostile/deep-nested.docx", &Limits::default());
    assert_eq!(limit_name(&r), "max_xml_depth");
}

#[test]
fn pdf_form_cycle_and_depth_are_refused() {
    let r = refused("hostile/xobject-cycle.pdf", &Limits::default());
    assert_eq!(limit_name(&r), "max_pdf_depth");
    // Deeply nested arrays: lopdf's parser stops at its nesting bound; the file is refused,
    // the stack is not exhausted.
    assert!(matches!(
        refused("hostile/deep-array.pdf", &Limits::default()),
        Refusal::Malformed { .. }
    ));
}

#[test]
fn pdf_decompression_bomb_is_refused() {
    let r = refused("hostile/huge-stream.pdf", &Limits::default());
    assert_eq!(limit_name(&r), "max_stream_bytes");
}

#[test]
fn nested_email_is_refused_past_the_attachment_depth() {
    let r = refused("hostile/deep-nested.eml", &Limits::default());
    assert_eq!(
        r.to_string(),
        "limit exceeded: max_attachment_depth (6 > 5)"
    );
    let l = Limits {
        max_attachment_depth: 20,
        ..Limits::default()
    };
    let x = extract(&read("hostile/deep-nested.eml"), Format::Eml, &l).unwrap();
    assert!(x.to_text().contains("innermost"));
    let l = Limits {
        max_attachment_depth: 0,
        ..Limits::default()
    };
    assert_eq!(limit_name(&refused("memo.eml", &l)), "max_attachment_depth");
    let l = Limits {
        max_attachments: 0,
        ..Limits::default()
    };
    assert_eq!(limit_name(&refused("memo.eml", &l)), "max_attachments");
}

#[test]
fn count_limits_pages_sheets_slides_cells_text_and_size() {
    let l = Limits {
        max_pages: 1,
        ..Limits::default()
    };
    assert_eq!(
        refused("table-two-pages.pdf", &l).to_string(),
        "limit exceeded: max_pages (2 > 1)"
    );
    let l = Limits {
        max_sheets: 1,
        ..Limits::default()
    };
    assert_eq!(limit_name(&refused("rates.xlsx", &l)), "max_sheets");
    let l = Limits {
        max_slides: 2,
        ..Limits::default()
    };
    assert_eq!(limit_name(&refused("committee.pptx", &l)), "max_slides");
    let l = Limits {
        max_cells: 10,
        ..Limits::default()
    };
    assert_eq!(limit_name(&refused("rates.xlsx", &l)), "max_cells");
    let l = Limits {
        max_text_bytes: 400,
        ..Limits::default()
    };
    for f in ["plain.pdf", "policy.docx", "memo.eml"] {
        assert_eq!(limit_name(&refused(f, &l)), "max_text_bytes", "{f}");
    }
    let l = Limits {
        max_file_bytes: 1000,
        ..Limits::default()
    };
    assert_eq!(limit_name(&refused("plain.pdf", &l)), "max_file_bytes");
    let l = Limits {
        max_stream_bytes: 100,
        ..Limits::default()
    };
    assert_eq!(limit_name(&refused("plain.pdf", &l)), "max_stream_bytes");
}

#[test]
fn wrong_or_legacy_containers_are_refused_not_misread() {
    let l = Limits::default();
    assert!(matches!(
        extract(b"not a zip", Format::Docx, &l),
        Err(Refusal::Malformed { .. })
    ));
    let mut ole = vec![0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1];
    ole.resize(512, 0);
    assert!(matches!(
        extract(&ole, Format::Xlsx, &l),
        Err(Refusal::Unsupported(_))
    ));
    ole.extend("EncryptedPackage".encode_utf16().flat_map(u16::to_le_bytes));
    assert_eq!(extract(&ole, Format::Docx, &l), Err(Refusal::Encrypted));
    assert!(matches!(
        extract(&read("plain.pdf"), Format::Pptx, &l),
        Err(Refusal::Malformed { .. })
    ));
    assert!(matches!(
        extract(&read("policy.docx"), Format::Pdf, &l),
        Err(Refusal::Malformed { .. })
    ));
}
