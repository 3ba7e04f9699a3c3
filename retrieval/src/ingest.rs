//! Turning files and JSON Lines into [`DocumentInput`]s: text, Markdown, HTML (rendered to text by
//! `html2text`, headings kept as `#` lines so the chunker can cut on them) and JSONL in the BEIR
//! (`_id`) and bank (`doc_id`) layouts.
//!
//! PDF, DOCX, XLSX/XLSM, PPTX, EML and CSV go through `airlock-extract`: its blocks become the
//! text (headings as `#` lines, tables one row per line) and [`Region`]s, the byte ranges of that
//! text with their [`Anchor`] (page, sheet + rows, slide, heading path), which the chunker cuts
//! on and every chunk keeps.
//!
//! Every function reports failures per document, so one bad file or line never stops a batch.

use std::io::BufRead;
use std::path::{Path, PathBuf};

pub use airlock_extract::{Anchor, Limits as ExtractLimits};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One document to upsert.
#[derive(Debug, Clone, PartialEq)]
pub struct DocumentInput {
    /// External id (stable across versions; maps to the ACL ordinal).
    pub doc_id: String,
    /// Title (may be empty).
    pub title: String,
    /// Plain text (already extracted).
    pub text: String,
    /// Free-form metadata, a JSON object.
    pub metadata: Map<String, Value>,
    /// Where the parts of `text` come from (extracted files; empty for text, Markdown, HTML and
    /// JSONL), in text order, not overlapping.
    pub regions: Vec<Region>,
    /// The file the document was read from, kept content-addressed with it (files ingested
    /// from a folder and raw uploads; `None` for text given as text and JSONL lines).
    pub original: Option<crate::originals::Original>,
}

/// A byte range of a document's text and where it sits in the original file.
#[derive(Debug, Clone, PartialEq)]
pub struct Region {
    /// First byte in [`DocumentInput::text`].
    pub byte_start: usize,
    /// One past the last byte.
    pub byte_end: usize,
    /// Page, sheet + rows, slide, heading path.
    pub anchor: Anchor,
    /// For a table: its header row, repeated at the top of every chunk of a split table.
    pub table_header: Option<String>,
}

impl DocumentInput {
    /// A document with no metadata.
    pub fn new(
        doc_id: impl Into<String>,
        title: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Self {
            doc_id: doc_id.into(),
            title: title.into(),
            text: text.into(),
            metadata: Map::new(),
            regions: Vec::new(),
            original: None,
        }
    }
}

/// The format of a document's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFormat {
    /// Plain UTF-8 text.
    Text,
    /// Markdown (kept as is: its headings guide the chunker).
    Markdown,
    /// HTML, rendered to text.
    Html,
    /// A file read by `airlock-extract` (PDF, DOCX, XLSX, PPTX, EML, CSV; MSG is refused).
    Extracted(airlock_extract::Format),
}

impl SourceFormat {
    /// The format for a file extension (`jsonl` is handled by [`parse_jsonl`]).
    pub fn from_extension(ext: &str) -> Option<Self> {
        match ext.to_ascii_lowercase().as_str() {
            "txt" | "text" => Some(Self::Text),
            "md" | "markdown" => Some(Self::Markdown),
            "html" | "htm" => Some(Self::Html),
            other => airlock_extract::Format::from_extension(other).map(Self::Extracted),
        }
    }

    /// The canonical media type (stored with an original read from a file).
    pub fn media_type(self) -> &'static str {
        use airlock_extract::Format as F;
        match self {
            Self::Text => F::Text.media_type(),
            Self::Markdown => F::Markdown.media_type(),
            Self::Html => F::Html.media_type(),
            Self::Extracted(f) => f.media_type(),
        }
    }

    /// The format for a media type (`Content-Type`, parameters ignored).
    pub fn from_media_type(media_type: &str) -> Option<Self> {
        use airlock_extract::Format as F;
        Some(match F::from_media_type(media_type)? {
            F::Text => Self::Text,
            F::Markdown => Self::Markdown,
            F::Html => Self::Html,
            f => Self::Extracted(f),
        })
    }
}

/// Longest accepted document id, in bytes: the ACL's id limit, so every stored document can be
/// granted.
pub const MAX_DOC_ID_BYTES: usize = airlock_acl::MAX_ID_BYTES;

/// Checks an external document id: non-empty, at most [`MAX_DOC_ID_BYTES`], no control
/// characters, no leading or trailing whitespace.
pub fn validate_doc_id(doc_id: &str) -> Result<()> {
    let reason = if doc_id.is_empty() {
        Some("empty")
    } else if doc_id.len() > MAX_DOC_ID_BYTES {
        Some("longer than 256 bytes")
    } else if doc_id.chars().any(char::is_control) {
        Some("contains control characters")
    } else if doc_id.trim() != doc_id {
        Some("has leading or trailing whitespace")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(Error::InvalidDocumentId {
            doc_id: doc_id.chars().take(80).collect(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Builds a document from raw bytes of a known format. `title` defaults to the first heading
/// (Markdown, HTML), the file's own title (extracted formats) or stays empty. Extracted formats
/// run under the default [`ExtractLimits`] with `max_bytes` as the file size limit.
pub fn parse_document(
    doc_id: &str,
    title: Option<&str>,
    bytes: &[u8],
    format: SourceFormat,
    max_bytes: usize,
) -> Result<DocumentInput> {
    let limits = ExtractLimits {
        max_file_bytes: max_bytes as u64,
        ..ExtractLimits::default()
    };
    parse_document_with(doc_id, title, bytes, format, max_bytes, &limits)
}

/// [`parse_document`] with explicit extraction limits.
pub fn parse_document_with(
    doc_id: &str,
    title: Option<&str>,
    bytes: &[u8],
    format: SourceFormat,
    max_bytes: usize,
    limits: &ExtractLimits,
) -> Result<DocumentInput> {
    validate_doc_id(doc_id)?;
    if bytes.len() > max_bytes {
        return Err(Error::DocumentTooLarge {
            doc_id: doc_id.to_owned(),
            bytes: bytes.len(),
            limit: max_bytes,
        });
    }
    if let SourceFormat::Extracted(f) = format {
        return extracted_document(doc_id, title, bytes, f, max_bytes, limits);
    }
    let raw = std::str::from_utf8(bytes).map_err(|e| Error::InvalidUtf8 {
        doc_id: doc_id.to_owned(),
        offset: e.valid_up_to(),
    })?;
    let text = match format {
        SourceFormat::Text | SourceFormat::Markdown | SourceFormat::Extracted(_) => raw.to_owned(),
        SourceFormat::Html => html_to_text(doc_id, raw, limits)?,
    };
    if text.trim().is_empty() {
        return Err(Error::EmptyDocument {
            doc_id: doc_id.to_owned(),
        });
    }
    let title = match (title, format) {
        (Some(t), _) => t.to_owned(),
        (None, SourceFormat::Markdown | SourceFormat::Html) => {
            first_heading(&text).unwrap_or_default()
        }
        (None, _) => String::new(),
    };
    Ok(DocumentInput {
        doc_id: doc_id.to_owned(),
        title,
        text,
        metadata: Map::new(),
        regions: Vec::new(),
        original: None,
    })
}

/// An extracted file as a document: blocks separated by blank lines, headings as `#` lines,
/// one region per block.
fn extracted_document(
    doc_id: &str,
    title: Option<&str>,
    bytes: &[u8],
    format: airlock_extract::Format,
    max_bytes: usize,
    limits: &ExtractLimits,
) -> Result<DocumentInput> {
    use airlock_extract::BlockKind;
    let x = airlock_extract::extract(bytes, format, limits).map_err(|r| Error::Extraction {
        doc_id: doc_id.to_owned(),
        reason: r.to_string(),
        code: r.code(),
    })?;
    let mut text = String::with_capacity(x.text_bytes() + x.blocks.len() * 4);
    let mut regions = Vec::with_capacity(x.blocks.len());
    for b in x.blocks {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        let start = text.len();
        if let BlockKind::Heading(level) = b.kind {
            for _ in 0..level.clamp(1, 6) {
                text.push('#');
            }
            text.push(' ');
        }
        let table_header = b.table_header().map(str::to_owned);
        // A block's own blank lines would read as paragraph breaks; keep them single.
        let mut last_nl = false;
        for c in b.text.chars() {
            if c == '\n' && last_nl {
                continue;
            }
            last_nl = c == '\n';
            text.push(c);
        }
        regions.push(Region {
            byte_start: start,
            byte_end: text.len(),
            anchor: b.anchor,
            table_header,
        });
    }
    if text.len() > max_bytes {
        return Err(Error::DocumentTooLarge {
            doc_id: doc_id.to_owned(),
            bytes: text.len(),
            limit: max_bytes,
        });
    }
    if text.trim().is_empty() {
        return Err(Error::EmptyDocument {
            doc_id: doc_id.to_owned(),
        });
    }
    Ok(DocumentInput {
        doc_id: doc_id.to_owned(),
        title: title.map(str::to_owned).or(x.title).unwrap_or_default(),
        text,
        metadata: Map::new(),
        regions,
        original: None,
    })
}

/// Renders HTML to plain text with `#` headings and blank lines between blocks; scripts, styles
/// and markup are dropped, entities decoded, links reduced to their text. Nesting deeper than
/// `max_html_depth` is refused before the HTML parser runs (`airlock_extract::html_to_text`).
fn html_to_text(doc_id: &str, html: &str, limits: &ExtractLimits) -> Result<String> {
    airlock_extract::html_to_text(html.as_bytes(), limits).map_err(|r| match r {
        r @ airlock_extract::Refusal::LimitExceeded { .. } => Error::Extraction {
            doc_id: doc_id.to_owned(),
            reason: r.to_string(),
            code: r.code(),
        },
        r => Error::InvalidJsonl {
            source_name: doc_id.to_owned(),
            line: 0,
            reason: format!("HTML could not be rendered: {r}"),
        },
    })
}

fn first_heading(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let t = l.trim_start();
        let rest = t.trim_start_matches('#');
        (rest.len() < t.len() && rest.starts_with(' ')).then(|| rest.trim().to_owned())
    })
}

/// Reads JSON Lines: one document per line, `{"doc_id"|"_id", "title"?, "text", "metadata"?}`.
/// Blank lines are skipped. One result per non-blank line, in order.
pub fn parse_jsonl(
    source_name: &str,
    reader: impl BufRead,
    max_bytes: usize,
) -> Vec<Result<DocumentInput>> {
    let mut out = Vec::new();
    for (i, line) in reader.split(b'\n').enumerate() {
        let line_no = i + 1;
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                out.push(Err(Error::InvalidJsonl {
                    source_name: source_name.to_owned(),
                    line: line_no,
                    reason: format!("read failed: {e}"),
                }));
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        out.push(parse_jsonl_line(source_name, line_no, &line, max_bytes));
    }
    out
}

fn parse_jsonl_line(
    source_name: &str,
    line_no: usize,
    line: &[u8],
    max_bytes: usize,
) -> Result<DocumentInput> {
    let bad = |reason: String| Error::InvalidJsonl {
        source_name: source_name.to_owned(),
        line: line_no,
        reason,
    };
    let label = || format!("{source_name} line {line_no}");
    if line.len() > max_bytes {
        return Err(Error::DocumentTooLarge {
            doc_id: label(),
            bytes: line.len(),
            limit: max_bytes,
        });
    }
    let s = std::str::from_utf8(line).map_err(|e| Error::InvalidUtf8 {
        doc_id: label(),
        offset: e.valid_up_to(),
    })?;
    let v: Value = serde_json::from_str(s).map_err(|e| bad(format!("not JSON: {e}")))?;
    let Value::Object(mut obj) = v else {
        return Err(bad("not a JSON object".into()));
    };
    let doc_id = match obj.remove("doc_id").or_else(|| obj.remove("_id")) {
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => return Err(bad("doc_id/_id must be a string or a number".into())),
        None => return Err(bad("missing doc_id (or _id)".into())),
    };
    validate_doc_id(&doc_id)?;
    let title = match obj.remove("title") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(_) => return Err(bad(format!("document {doc_id}: title must be a string"))),
    };
    let text = match obj.remove("text") {
        Some(Value::String(s)) => s,
        None | Some(Value::Null) => return Err(Error::EmptyDocument { doc_id }),
        Some(_) => return Err(bad(format!("document {doc_id}: text must be a string"))),
    };
    if text.trim().is_empty() {
        return Err(Error::EmptyDocument { doc_id });
    }
    let metadata = match obj.remove("metadata") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(bad(format!(
                "document {doc_id}: metadata must be an object"
            )));
        }
    };
    Ok(DocumentInput {
        doc_id,
        title,
        text,
        metadata,
        regions: Vec::new(),
        original: None,
    })
}

/// Reads a file or, recursively, a directory (files in sorted path order). Files are identified
/// by their path relative to `path` (or their file name when `path` is a file); JSONL files
/// contribute one document per line. Unsupported files produce an error entry and are skipped.
pub fn read_path(path: &Path, max_bytes: usize) -> Result<Vec<Result<DocumentInput>>> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    let mut files = Vec::new();
    if meta.is_dir() {
        collect_files(path, &mut files)?;
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut out = Vec::new();
    for file in files {
        let rel = if meta.is_dir() {
            file.strip_prefix(path).unwrap_or(&file).to_path_buf()
        } else {
            PathBuf::from(file.file_name().unwrap_or(file.as_os_str()))
        };
        let doc_id = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/");
        let ext = file.extension().and_then(|e| e.to_str()).unwrap_or("");
        if matches!(ext.to_ascii_lowercase().as_str(), "jsonl" | "ndjson") {
            let f = std::fs::File::open(&file).map_err(|e| Error::io(&file, e))?;
            out.extend(parse_jsonl(&doc_id, std::io::BufReader::new(f), max_bytes));
            continue;
        }
        let Some(format) = SourceFormat::from_extension(ext) else {
            out.push(Err(Error::UnsupportedFormat { path: file }));
            continue;
        };
        let size = std::fs::metadata(&file)
            .map_err(|e| Error::io(&file, e))?
            .len();
        if size > max_bytes as u64 {
            out.push(Err(Error::DocumentTooLarge {
                doc_id,
                bytes: usize::try_from(size).unwrap_or(usize::MAX),
                limit: max_bytes,
            }));
            continue;
        }
        let bytes = std::fs::read(&file).map_err(|e| Error::io(&file, e))?;
        out.push(
            parse_document(&doc_id, None, &bytes, format, max_bytes).map(|mut d| {
                d.original = Some(crate::originals::Original::new(format.media_type(), bytes));
                d
            }),
        );
    }
    Ok(out)
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let ty = entry.file_type().map_err(|e| Error::io(entry.path(), e))?;
        if ty.is_dir() {
            collect_files(&entry.path(), out)?;
        } else if ty.is_file() {
            out.push(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_accepts_both_layouts_and_reports_bad_lines() {
        let input = concat!(
            r#"{"_id": "1", "title": "t", "text": "beir text", "metadata": {}}"#,
            "\n",
            r#"{"doc_id": "doc-2", "title": "b", "text": "bank text", "metadata": {"kind": "faq"}}"#,
            "\n",
            "\n",
            r#"{"doc_id": "doc-3", "text": "  "}"#,
            "\n",
            "not json\n",
            r#"{"title": "no id", "text": "x"}"#,
            "\n",
            r#"{"_id": 7, "text": "numeric id"}"#,
            "\n",
        );
        let mut bytes = input.as_bytes().to_vec();
        bytes.extend_from_slice(b"{\"_id\": \"8\", \"text\": \"bad \xff byte\"}\n");
        let r = parse_jsonl("c.jsonl", &bytes[..], 1 << 20);
        assert_eq!(r.len(), 7);
        assert_eq!(r[0].as_ref().unwrap().doc_id, "1");
        assert_eq!(r[1].as_ref().unwrap().metadata["kind"], "faq");
        assert!(matches!(&r[2], Err(Error::EmptyDocument { doc_id }) if doc_id == "doc-3"));
        assert!(matches!(&r[3], Err(Error::InvalidJsonl { line: 5, .. })));
        assert!(
            matches!(&r[4], Err(Error::InvalidJsonl { line: 6, reason, .. }) if reason.contains("missing doc_id"))
        );
        assert_eq!(r[5].as_ref().unwrap().doc_id, "7");
        assert!(matches!(&r[6], Err(Error::InvalidUtf8 { offset, .. }) if *offset == 26));
        let big = parse_jsonl("c", r#"{"_id":"x","text":"0123456789"}"#.as_bytes(), 10);
        assert!(matches!(
            &big[0],
            Err(Error::DocumentTooLarge { limit: 10, .. })
        ));
    }

    #[test]
    fn html_is_rendered_to_text_with_headings() {
        let html = b"<html><head><title>T</title><style>p{color:red}</style><script>var x=1;</script></head>\
            <body><h1>Loan &amp; Credit</h1><p>First <b>paragraph</b> with a <a href='http://x'>link</a>.</p>\
            <h2>Second</h2><p>Another one.</p></body></html>";
        let d = parse_document("h.html", None, html, SourceFormat::Html, 1 << 20).unwrap();
        assert_eq!(d.title, "Loan & Credit");
        // Link text is kept (in brackets: html2text marks links even undecorated).
        assert!(
            d.text.contains("First paragraph with a [link]."),
            "{}",
            d.text
        );
        assert!(d.text.contains("## Second"), "{}", d.text);
        assert!(
            !d.text.contains("color") && !d.text.contains("var x"),
            "{}",
            d.text
        );
        assert!(!d.text.contains('<'), "{}", d.text);
    }

    #[test]
    fn per_document_errors_are_specific() {
        assert!(matches!(
            parse_document("a", None, b"ok \xc3\x28", SourceFormat::Text, 100),
            Err(Error::InvalidUtf8 { offset: 3, .. })
        ));
        assert!(matches!(
            parse_document("a", None, b" \n\t ", SourceFormat::Markdown, 100),
            Err(Error::EmptyDocument { .. })
        ));
        assert!(matches!(
            parse_document("a", None, b"<p> </p>", SourceFormat::Html, 100),
            Err(Error::EmptyDocument { .. })
        ));
        assert!(matches!(
            parse_document("a", None, &[b'x'; 101], SourceFormat::Text, 100),
            Err(Error::DocumentTooLarge {
                bytes: 101,
                limit: 100,
                ..
            })
        ));
        assert!(matches!(
            parse_document("", None, b"x", SourceFormat::Text, 100),
            Err(Error::InvalidDocumentId { .. })
        ));
        let md = parse_document(
            "m.md",
            None,
            b"intro\n\n# Title here\n\nbody",
            SourceFormat::Markdown,
            100,
        )
        .unwrap();
        assert_eq!(md.title, "Title here");
    }
}
