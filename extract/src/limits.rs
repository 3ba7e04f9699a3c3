//! The limits every extraction runs under, and the running budget of one file.

use crate::{Block, Refusal};

/// Resource limits for one file (and, for e-mail, everything attached to it). The defaults are
/// sized for the appliance's 2-core / 24 GiB box with a few extractions in parallel: a
/// legitimate 2,000-page board pack or a 50-sheet rate workbook passes, a bomb does not.
/// Deserializable, so the appliance's config file can carry it (missing fields take defaults).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Largest input file, bytes (default 100 MiB).
    pub max_file_bytes: u64,
    /// Most PDF pages (default 5,000).
    pub max_pages: u32,
    /// Most XLSX sheets (default 200).
    pub max_sheets: u32,
    /// Most PPTX slides (default 2,000).
    pub max_slides: u32,
    /// Most non-empty spreadsheet or CSV cells read (default 2,000,000).
    pub max_cells: u64,
    /// Most extracted text, bytes, over the whole file and its attachments (default 64 MiB).
    pub max_text_bytes: u64,
    /// Most entries in a zip container (DOCX/XLSX/PPTX, default 10,000).
    pub max_zip_entries: u32,
    /// Most total uncompressed bytes in a zip container (default 1 GiB).
    pub max_zip_bytes: u64,
    /// Largest total uncompressed / compressed size ratio of a zip container (default 200).
    pub max_zip_ratio: u32,
    /// Deepest XML element nesting in an OOXML part (default 256). DTDs are always refused, so
    /// no entity is ever expanded.
    pub max_xml_depth: u32,
    /// Deepest PDF object or form XObject nesting followed (default 32).
    pub max_pdf_depth: u32,
    /// Largest decompressed PDF stream, bytes (default 128 MiB).
    pub max_stream_bytes: u64,
    /// Most PDF content-stream bytes interpreted over the whole file, a form XObject counted
    /// each time it is drawn (default 512 MiB): bounds the work of forms drawn over and over.
    pub max_pdf_content_bytes: u64,
    /// Most operand tokens of one PDF content-stream operation, array and dictionary elements
    /// counted one by one (default 100,000): a `TJ` array of millions of strings would cost
    /// tens of bytes of memory per byte of content before it could be looked at.
    pub max_pdf_operands: u32,
    /// Deepest HTML element nesting (default 512, where browsers stop nesting too): the HTML
    /// tree builder's work grows with the square of the depth.
    pub max_html_depth: u32,
    /// Deepest e-mail attachment nesting (a message attached to a message attached to ...;
    /// default 5).
    pub max_attachment_depth: u32,
    /// Most attachments extracted from one message (default 100).
    pub max_attachments: u32,
    /// **Measurement only** (off by default, never read from a configuration file): return
    /// every table as plain text, a paragraph with a line per row of space-separated cells and
    /// no header row, as a text-only extractor would. The extract example's `--jsonl --tables-as-text`
    /// sets it for the table-question slice of docs/benchmarks/extraction.md.
    #[serde(skip)]
    #[doc(hidden)]
    pub tables_as_text: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_file_bytes: 100 << 20,
            max_pages: 5_000,
            max_sheets: 200,
            max_slides: 2_000,
            max_cells: 2_000_000,
            max_text_bytes: 64 << 20,
            max_zip_entries: 10_000,
            max_zip_bytes: 1 << 30,
            max_zip_ratio: 200,
            max_xml_depth: 256,
            max_pdf_depth: 32,
            max_stream_bytes: 128 << 20,
            max_pdf_content_bytes: 512 << 20,
            max_pdf_operands: 100_000,
            max_html_depth: 512,
            max_attachment_depth: 5,
            max_attachments: 100,
            tables_as_text: false,
        }
    }
}

/// What one extraction has used so far.
pub(crate) struct Budget {
    max_text: u64,
    text: u64,
    max_cells: u64,
    cells: u64,
}

impl Budget {
    pub(crate) fn new(limits: &Limits) -> Self {
        Self {
            max_text: limits.max_text_bytes,
            text: 0,
            max_cells: limits.max_cells,
            cells: 0,
        }
    }

    /// Counts `bytes` of extracted text.
    pub(crate) fn text(&mut self, bytes: usize) -> Result<(), Refusal> {
        self.text += bytes as u64;
        if self.text > self.max_text {
            return Err(Refusal::limit("max_text_bytes", self.text, self.max_text));
        }
        Ok(())
    }

    /// Counts one non-empty cell.
    pub(crate) fn cell(&mut self) -> Result<(), Refusal> {
        self.cells += 1;
        if self.cells > self.max_cells {
            return Err(Refusal::limit("max_cells", self.cells, self.max_cells));
        }
        Ok(())
    }

    /// Pushes a block, counting its text. Blank blocks are dropped.
    pub(crate) fn push(&mut self, out: &mut Vec<Block>, block: Block) -> Result<(), Refusal> {
        if block.text.trim().is_empty() {
            return Ok(());
        }
        self.text(block.text.len())?;
        out.push(block);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_deserialize_with_defaults_and_refuse_unknown_fields() {
        let l: Limits = serde_json::from_str(r#"{"max_pages": 10}"#).unwrap();
        assert_eq!(l.max_pages, 10);
        assert_eq!(l.max_sheets, Limits::default().max_sheets);
        assert!(serde_json::from_str::<Limits>(r#"{"max_pagez": 10}"#).is_err());
    }

    #[test]
    fn the_measurement_switch_is_off_by_default_and_not_configurable() {
        assert!(!Limits::default().tables_as_text);
        assert!(serde_json::from_str::<Limits>(r#"{"tables_as_text": true}"#).is_err());
        let json = serde_json::to_string(&Limits::default()).unwrap();
        assert!(!json.contains("tables_as_text"), "{json}");
    }
}
