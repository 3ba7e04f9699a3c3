//! `airlock-extract`: text, tables and anchors out of the files a bank keeps — PDF, DOCX,
//! XLSX/XLSM, PPTX, EML, CSV, plus plain text, Markdown and HTML — within [`Limits`].
//!
//! Pure Rust, no network, no C libraries. The one entry point is [`extract`]: bytes and a
//! [`Format`] in, an [`Extracted`] document (title and [`Block`]s, each with its [`Anchor`]:
//! page, sheet and row range, slide, heading path) or a typed [`Refusal`] with a reason a
//! person can act on out. Tables are kept as rows ("cell | cell", one row per line) with their
//! header row counted, so a chunker can repeat the header in every piece of a split table.
//!
//! A hostile file (zip bomb, billion laughs, deep nesting, reference cycles, decompression
//! bombs) is refused by a limit, never by a panic or by exhausting memory; see
//! docs/EXTRACTION.md.
#![warn(missing_docs)]

mod csv;
mod eml;
#[doc(hidden)]
pub mod fuzzing;
mod html;
mod limits;
mod ooxml;
mod pdf;
mod pdf_metrics;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
mod text;
mod xlsx;
mod xml;

use std::fmt;

pub use html::html_to_text;
pub use limits::Limits;

/// The formats [`extract`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// PDF (text layer only).
    Pdf,
    /// Word 2007+ (`.docx`, `.docm`).
    Docx,
    /// Excel 2007+ (`.xlsx`, `.xlsm`).
    Xlsx,
    /// PowerPoint 2007+ (`.pptx`, `.pptm`).
    Pptx,
    /// An e-mail message (RFC 5322 / MIME, `.eml`).
    Eml,
    /// An Outlook `.msg` file: always refused (save it as `.eml`).
    Msg,
    /// Comma-separated values with a header row.
    Csv,
    /// Plain UTF-8 text.
    Text,
    /// Markdown.
    Markdown,
    /// HTML.
    Html,
}

impl Format {
    /// The format of a file extension (case-insensitive, without the dot).
    pub fn from_extension(ext: &str) -> Option<Self> {
        Some(match ext.to_ascii_lowercase().as_str() {
            "pdf" => Self::Pdf,
            "docx" | "docm" => Self::Docx,
            "xlsx" | "xlsm" => Self::Xlsx,
            "pptx" | "pptm" => Self::Pptx,
            "eml" => Self::Eml,
            "msg" => Self::Msg,
            "csv" => Self::Csv,
            "txt" | "text" => Self::Text,
            "md" | "markdown" => Self::Markdown,
            "html" | "htm" => Self::Html,
            _ => return None,
        })
    }

    /// The format of a media type (`Content-Type`; parameters such as `; charset=utf-8` are
    /// ignored).
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        let essence = media_type.split(';').next()?.trim().to_ascii_lowercase();
        Some(match essence.as_str() {
            "application/pdf" => Self::Pdf,
            "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
            | "application/vnd.ms-word.document.macroenabled.12" => Self::Docx,
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
            | "application/vnd.ms-excel.sheet.macroenabled.12" => Self::Xlsx,
            "application/vnd.openxmlformats-officedocument.presentationml.presentation"
            | "application/vnd.ms-powerpoint.presentation.macroenabled.12" => Self::Pptx,
            "message/rfc822" => Self::Eml,
            "application/vnd.ms-outlook" => Self::Msg,
            "text/csv" => Self::Csv,
            "text/plain" => Self::Text,
            "text/markdown" => Self::Markdown,
            "text/html" => Self::Html,
            _ => return None,
        })
    }

    /// The canonical media type.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Pdf => "application/pdf",
            Self::Docx => "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            Self::Xlsx => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            Self::Pptx => {
                "application/vnd.openxmlformats-officedocument.presentationml.presentation"
            }
            Self::Eml => "message/rfc822",
            Self::Msg => "application/vnd.ms-outlook",
            Self::Csv => "text/csv",
            Self::Text => "text/plain",
            Self::Markdown => "text/markdown",
            Self::Html => "text/html",
        }
    }

    /// A short lowercase name (`pdf`, `docx`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Pdf => "pdf",
            Self::Docx => "docx",
            Self::Xlsx => "xlsx",
            Self::Pptx => "pptx",
            Self::Eml => "eml",
            Self::Msg => "msg",
            Self::Csv => "csv",
            Self::Text => "text",
            Self::Markdown => "markdown",
            Self::Html => "html",
        }
    }
}

/// Where a block sits in its file. Every field is optional except the heading path, which is
/// empty before the first heading.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Anchor {
    /// 1-based PDF page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u32>,
    /// Spreadsheet sheet name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sheet: Option<String>,
    /// 1-based inclusive row range in the sheet (or CSV file, header row = 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<(u32, u32)>,
    /// 1-based PPTX slide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slide: Option<u32>,
    /// Heading path, outermost first (an e-mail attachment adds its file name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub section: Vec<String>,
}

/// What a block is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// A heading of `level` (1 = outermost). Its text is also the last element of the section
    /// path of the blocks that follow it.
    Heading(u8),
    /// A paragraph of running text.
    Paragraph,
    /// One list item (its text starts with "- " or "N. ").
    ListItem,
    /// A table: one row per line, cells separated by `" | "`; the first `header_rows` lines are
    /// its header.
    Table {
        /// Number of header lines at the top of the text (0 or 1).
        header_rows: u32,
    },
}

/// One unit of extracted content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// What it is.
    pub kind: BlockKind,
    /// Its text (no trailing newline).
    pub text: String,
    /// Where it is.
    pub anchor: Anchor,
}

impl Block {
    /// The header line of a table block, if it has one.
    pub fn table_header(&self) -> Option<&str> {
        match self.kind {
            BlockKind::Table { header_rows: 1.. } => self.text.lines().next(),
            _ => None,
        }
    }
}

/// An extracted document.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Extracted {
    /// The title the file itself carries (document properties, e-mail subject, first heading),
    /// if any.
    pub title: Option<String>,
    /// The content, in reading order.
    pub blocks: Vec<Block>,
    /// Pages (PDF), sheets (XLSX) or slides (PPTX) read.
    pub units: u32,
}

impl Extracted {
    /// Total bytes of block text.
    pub fn text_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.text.len()).sum()
    }

    /// The blocks as one text: headings as Markdown `#` lines, blocks separated by blank lines
    /// (what a text-only consumer stores).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for b in &self.blocks {
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            if let BlockKind::Heading(level) = b.kind {
                for _ in 0..level.clamp(1, 6) {
                    out.push('#');
                }
                out.push(' ');
            }
            out.push_str(&b.text);
        }
        out
    }
}

/// Why a file was not extracted. `Display` is the reason shown to a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A PDF (or a part of one) without text to read: a scan or an image.
    #[error("no text layer; OCR is not supported")]
    NoTextLayer,
    /// The file needs a password.
    #[error("encrypted or password-protected")]
    Encrypted,
    /// A format that is recognised but not read.
    #[error("{0}")]
    Unsupported(&'static str),
    /// A limit of [`Limits`] was exceeded.
    #[error("limit exceeded: {what} ({value} > {limit})")]
    LimitExceeded {
        /// Which limit (`Limits` field name).
        what: &'static str,
        /// The value found (or reached when reading stopped).
        value: u64,
        /// The limit.
        limit: u64,
    },
    /// The file is not a valid file of its format.
    #[error("malformed {format}: {reason}")]
    Malformed {
        /// The format it was read as.
        format: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A file that holds no text at all (an empty sheet, an empty message).
    #[error("no text found")]
    Empty,
}

impl Refusal {
    pub(crate) fn limit(
        what: &'static str,
        value: impl TryInto<u64>,
        limit: impl TryInto<u64>,
    ) -> Self {
        Self::LimitExceeded {
            what,
            value: value.try_into().unwrap_or(u64::MAX),
            limit: limit.try_into().unwrap_or(u64::MAX),
        }
    }

    pub(crate) fn malformed(format: Format, reason: impl fmt::Display) -> Self {
        let mut reason = reason.to_string();
        if reason.len() > 300 {
            let mut cut = 300;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
        }
        Self::Malformed {
            format: format.name(),
            reason,
        }
    }

    /// A stable machine-readable code (`no_text_layer`, `encrypted`, `unsupported`,
    /// `limit_exceeded`, `malformed`, `empty`).
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoTextLayer => "no_text_layer",
            Self::Encrypted => "encrypted",
            Self::Unsupported(_) => "unsupported",
            Self::LimitExceeded { .. } => "limit_exceeded",
            Self::Malformed { .. } => "malformed",
            Self::Empty => "empty",
        }
    }
}

/// Extracts `bytes` as `format` within `limits`.
pub fn extract(bytes: &[u8], format: Format, limits: &Limits) -> Result<Extracted, Refusal> {
    let mut budget = limits::Budget::new(limits);
    extract_with(bytes, format, limits, &mut budget, 0)
}

/// [`extract`] at e-mail attachment depth `depth`, sharing the text budget of the outer file.
pub(crate) fn extract_with(
    bytes: &[u8],
    format: Format,
    limits: &Limits,
    budget: &mut limits::Budget,
    depth: u32,
) -> Result<Extracted, Refusal> {
    if bytes.len() as u64 > limits.max_file_bytes {
        return Err(Refusal::limit(
            "max_file_bytes",
            bytes.len(),
            limits.max_file_bytes,
        ));
    }
    let out = match format {
        Format::Pdf => pdf::extract(bytes, limits, budget)?,
        Format::Docx => ooxml::extract_docx(bytes, limits, budget)?,
        Format::Pptx => ooxml::extract_pptx(bytes, limits, budget)?,
        Format::Xlsx => xlsx::extract(bytes, limits, budget)?,
        Format::Eml => eml::extract(bytes, limits, budget, depth)?,
        Format::Msg => {
            return Err(Refusal::Unsupported(
                "MSG (Outlook) files are not supported: save as .eml",
            ));
        }
        Format::Csv => csv::extract(bytes, budget)?,
        Format::Text | Format::Markdown => text::extract_markdown(bytes, format, budget)?,
        Format::Html => text::extract_html(bytes, limits, budget)?,
    };
    if out.blocks.iter().all(|b| b.text.trim().is_empty()) {
        return Err(Refusal::Empty);
    }
    let mut out = out;
    if limits.tables_as_text {
        tables_as_text(&mut out);
    }
    Ok(out)
}

/// The measurement-only switch [`Limits::tables_as_text`]: every table block becomes a
/// paragraph, one line per row with its cells separated by single spaces and no header row
/// marked (what a text-layer dump of a table gives), so the chunker does not repeat a header
/// in the pieces of a split table and cell boundaries are lost.
fn tables_as_text(x: &mut Extracted) {
    for b in &mut x.blocks {
        if let BlockKind::Table { .. } = b.kind {
            let rows: Vec<String> = b
                .text
                .lines()
                .map(|l| {
                    let cells: Vec<&str> = l
                        .split(" | ")
                        .map(str::trim)
                        .filter(|c| !c.is_empty())
                        .collect();
                    cells.join(" ")
                })
                .collect();
            b.text = rows.join("\n");
            b.kind = BlockKind::Paragraph;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_from_extension_and_media_type() {
        for f in [
            Format::Pdf,
            Format::Docx,
            Format::Xlsx,
            Format::Pptx,
            Format::Eml,
            Format::Msg,
            Format::Csv,
            Format::Text,
            Format::Markdown,
            Format::Html,
        ] {
            assert_eq!(Format::from_media_type(f.media_type()), Some(f));
        }
        assert_eq!(Format::from_extension("PDF"), Some(Format::Pdf));
        assert_eq!(Format::from_extension("xlsm"), Some(Format::Xlsx));
        assert_eq!(Format::from_extension("doc"), None);
        assert_eq!(
            Format::from_media_type("text/csv; charset=utf-8"),
            Some(Format::Csv)
        );
        assert_eq!(Format::from_media_type("application/zip"), None);
    }

    #[test]
    fn msg_is_refused_with_advice() {
        let r = extract(b"\xd0\xcf\x11\xe0", Format::Msg, &Limits::default()).unwrap_err();
        assert_eq!(
            r.to_string(),
            "MSG (Outlook) files are not supported: save as .eml"
        );
    }

    #[test]
    fn tables_as_text_is_a_measurement_switch_that_flattens_tables_only() {
        let csv =
            b"Branch,City,Deposits\nHarbour Street,Portsmouth,412.5\nOld Town,Edinburgh,302.9\n";
        let rows = extract(csv, Format::Csv, &Limits::default()).unwrap();
        assert_eq!(rows.blocks[0].kind, BlockKind::Table { header_rows: 1 });
        assert_eq!(
            rows.blocks[0].text,
            "Branch | City | Deposits\nHarbour Street | Portsmouth | 412.5\nOld Town | Edinburgh | 302.9"
        );
        let limits = Limits {
            tables_as_text: true,
            ..Limits::default()
        };
        let flat = extract(csv, Format::Csv, &limits).unwrap();
        assert_eq!(flat.blocks[0].kind, BlockKind::Paragraph);
        assert_eq!(
            flat.blocks[0].text,
            "Branch City Deposits\nHarbour Street Portsmouth 412.5\nOld Town Edinburgh 302.9"
        );
        assert_eq!(flat.blocks[0].anchor, rows.blocks[0].anchor);
        // Other blocks are untouched.
        let md = b"# Rates\n\nRates apply from June.\n";
        assert_eq!(
            extract(md, Format::Markdown, &limits).unwrap(),
            extract(md, Format::Markdown, &Limits::default()).unwrap()
        );
    }

    #[test]
    fn file_size_limit_refuses_before_parsing() {
        let limits = Limits {
            max_file_bytes: 10,
            ..Limits::default()
        };
        let r = extract(b"hello world, eleven+", Format::Text, &limits).unwrap_err();
        assert_eq!(r.to_string(), "limit exceeded: max_file_bytes (20 > 10)");
    }
}
