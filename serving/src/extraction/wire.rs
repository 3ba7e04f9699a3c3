//! The frames between the daemon and an extraction worker, over the worker's stdin and stdout.
//!
//! Every frame is a little-endian `u32` length, that much JSON, a little-endian `u64` length
//! and that many raw bytes (the file going in, the extracted text coming out), so the bulk is
//! never escaped. The worker speaks first: a [`Hello`], then one [`Answer`] per [`Request`].

use std::io::{Read, Write};

use airlock_retrieval::ingest::{Anchor, ExtractLimits, Region};
use serde::{Deserialize, Serialize};

/// What this protocol is called; a worker of another version is refused.
pub const PROTOCOL: &str = "airlock-extract/1";

/// The worker's first frame.
#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL`].
    pub protocol: String,
    /// Whether its Landlock sandbox (no file system, no TCP) is enforced.
    pub sandboxed: bool,
    /// The kernel's Landlock status, for the daemon's log.
    pub sandbox: String,
}

/// One file to extract.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    /// The document id (the worker validates it as the daemon does; it never logs it).
    pub doc_id: String,
    /// The title given with the upload, if any.
    pub title: Option<String>,
    /// The format, as its media type.
    pub media_type: String,
    /// The document store's `max_document_bytes`.
    pub max_bytes: usize,
    /// The extractor's limits; absent: those of the worker's previous request (they rarely
    /// change, and parsing them is a measurable part of a small file's round trip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ExtractLimits>,
    /// CPU seconds this file may use.
    pub cpu_secs: u64,
}

/// The regions of a document on the wire: the tables of distinct heading paths and of strings
/// (sheet names, table header rows) go in the answer's JSON, the regions themselves in a compact
/// binary form after the text (a long PDF has thousands of regions, and a heading path is
/// shared by every block under its heading: as JSON, one object per region repeating its
/// path, they cost more than the extraction of a small file). Per region, little-endian: start
/// and end (`u64`), a flag byte (1 page, 2 sheet, 4 rows, 8 slide, 16 header), the fields
/// flagged (`u32`; sheet and header as indexes into the strings, rows as two), then the
/// path's index (`u32`).
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RegionTables {
    /// Distinct heading paths.
    pub paths: Vec<Vec<String>>,
    /// Distinct sheet names and table header rows.
    pub strings: Vec<String>,
    /// How many regions the binary part holds.
    pub count: usize,
}

const PAGE: u8 = 1;
const SHEET: u8 = 2;
const ROWS: u8 = 4;
const SLIDE: u8 = 8;
const HEADER: u8 = 16;

/// Encodes `regions` (see [`RegionTables`]), appending the binary part to `out`.
pub fn encode_regions(regions: Vec<Region>, out: &mut Vec<u8>) -> RegionTables {
    use std::collections::HashMap;
    fn intern<K: std::hash::Hash + Eq + Clone>(
        table: &mut Vec<K>,
        index: &mut HashMap<K, u32>,
        k: K,
    ) -> u32 {
        if let Some(&i) = index.get(&k) {
            return i;
        }
        table.push(k.clone());
        let i = (table.len() - 1) as u32;
        index.insert(k, i);
        i
    }
    let mut t = RegionTables {
        count: regions.len(),
        ..RegionTables::default()
    };
    let (mut paths, mut strings) = (HashMap::new(), HashMap::new());
    out.reserve(regions.len() * 24);
    for r in regions {
        let a = r.anchor;
        let flag = |present: bool, f: u8| if present { f } else { 0 };
        let flags = flag(a.page.is_some(), PAGE)
            | flag(a.sheet.is_some(), SHEET)
            | flag(a.rows.is_some(), ROWS)
            | flag(a.slide.is_some(), SLIDE)
            | flag(r.table_header.is_some(), HEADER);
        out.extend_from_slice(&(r.byte_start as u64).to_le_bytes());
        out.extend_from_slice(&(r.byte_end as u64).to_le_bytes());
        out.push(flags);
        let mut put = |v: u32| out.extend_from_slice(&v.to_le_bytes());
        if let Some(p) = a.page {
            put(p);
        }
        if let Some(s) = a.sheet {
            put(intern(&mut t.strings, &mut strings, s));
        }
        if let Some((x, y)) = a.rows {
            put(x);
            put(y);
        }
        if let Some(s) = a.slide {
            put(s);
        }
        if let Some(h) = r.table_header {
            put(intern(&mut t.strings, &mut strings, h));
        }
        put(intern(&mut t.paths, &mut paths, a.section));
    }
    t
}

/// The regions of [`encode_regions`] back from the binary part `bytes`; `None` when it is
/// malformed (short, trailing bytes, an index out of its table).
pub fn decode_regions(t: &RegionTables, mut bytes: &[u8]) -> Option<Vec<Region>> {
    fn take<const N: usize>(b: &mut &[u8]) -> Option<[u8; N]> {
        let (head, rest) = b.split_first_chunk::<N>()?;
        *b = rest;
        Some(*head)
    }
    let u32_ = |b: &mut &[u8]| take::<4>(b).map(u32::from_le_bytes);
    let string = |b: &mut &[u8]| t.strings.get(u32_(b)? as usize).cloned();
    // Each region takes at least 21 bytes: a count beyond that is a lie.
    let mut out = Vec::with_capacity(t.count.min(bytes.len() / 21));
    for _ in 0..t.count {
        let start = usize::try_from(u64::from_le_bytes(take(&mut bytes)?)).ok()?;
        let end = usize::try_from(u64::from_le_bytes(take(&mut bytes)?)).ok()?;
        let [flags] = take::<1>(&mut bytes)?;
        let has = |f: u8| flags & f != 0;
        let page = if has(PAGE) {
            Some(u32_(&mut bytes)?)
        } else {
            None
        };
        let sheet = if has(SHEET) {
            Some(string(&mut bytes)?)
        } else {
            None
        };
        let rows = if has(ROWS) {
            Some((u32_(&mut bytes)?, u32_(&mut bytes)?))
        } else {
            None
        };
        let slide = if has(SLIDE) {
            Some(u32_(&mut bytes)?)
        } else {
            None
        };
        let table_header = if has(HEADER) {
            Some(string(&mut bytes)?)
        } else {
            None
        };
        let section = t.paths.get(u32_(&mut bytes)? as usize)?.clone();
        out.push(Region {
            byte_start: start,
            byte_end: end,
            anchor: Anchor {
                page,
                sheet,
                rows,
                slide,
                section,
            },
            table_header,
        });
    }
    bytes.is_empty().then_some(out)
}

/// Why the worker refused a file (`airlock_retrieval::Error`'s per-document variants).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Refused {
    /// The extractor's refusal.
    Extraction {
        /// For a person.
        reason: String,
        /// The stable code.
        code: String,
    },
    /// Not UTF-8 (text formats).
    InvalidUtf8 {
        /// The first bad byte.
        offset: usize,
    },
    /// No text.
    Empty,
    /// File or text over `max_document_bytes`.
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
    /// HTML that could not be rendered.
    Unrenderable {
        /// Why.
        reason: String,
    },
    /// An invalid document id.
    InvalidId {
        /// Why.
        reason: String,
    },
    /// The extractor panicked (a bug; the file is refused, the worker goes on).
    Panicked {
        /// Where (file and line, never the message, which may quote the file).
        location: String,
    },
}

/// The worker's answer to one [`Request`]; the text follows as the frame's bytes.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Extracted: the title, and the frame's bytes are the text (`text_len` bytes) followed by
    /// the regions ([`encode_regions`]).
    Document {
        /// The title.
        title: String,
        /// Bytes of text at the start of the frame's bytes.
        text_len: usize,
        /// The regions' tables.
        regions: RegionTables,
    },
    /// Refused.
    Refused(Refused),
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, head: &impl Serialize, bytes: &[u8]) -> std::io::Result<()> {
    let json = serde_json::to_vec(head).map_err(std::io::Error::other)?;
    let len = u32::try_from(json.len()).map_err(std::io::Error::other)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&json)?;
    w.write_all(&(bytes.len() as u64).to_le_bytes())?;
    w.write_all(bytes)?;
    w.flush()
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream ended before the frame began.
    #[error("end of stream")]
    Eof,
    /// A read failed or the stream ended inside the frame.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The JSON or the raw part is longer than allowed.
    #[error("frame of {0} bytes over its limit")]
    TooLong(u64),
    /// The JSON does not parse.
    #[error("bad frame: {0}")]
    Json(#[from] serde_json::Error),
}

/// Reads one frame: at most `max_json` bytes of JSON and `max_bytes` raw bytes.
pub fn read_frame<T: for<'de> Deserialize<'de>>(
    r: &mut impl Read,
    max_json: u64,
    max_bytes: u64,
) -> Result<(T, Vec<u8>), FrameError> {
    let mut len = [0u8; 4];
    match r.read(&mut len[..1])? {
        0 => return Err(FrameError::Eof),
        _ => r.read_exact(&mut len[1..])?,
    }
    let len = u64::from(u32::from_le_bytes(len));
    if len > max_json {
        return Err(FrameError::TooLong(len));
    }
    let mut json = vec![0u8; len as usize];
    r.read_exact(&mut json)?;
    let head = serde_json::from_slice(&json)?;
    drop(json);
    let mut blen = [0u8; 8];
    r.read_exact(&mut blen)?;
    let blen = u64::from_le_bytes(blen);
    if blen > max_bytes {
        return Err(FrameError::TooLong(blen));
    }
    let mut bytes = vec![0u8; blen as usize];
    r.read_exact(&mut bytes)?;
    Ok((head, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_enforce_their_limits() {
        let regions = vec![
            Region {
                byte_start: 0,
                byte_end: 4,
                anchor: Anchor {
                    page: Some(2),
                    section: vec!["Rates".into(), "Fixed".into()],
                    ..Anchor::default()
                },
                table_header: Some("Term | Rate".into()),
            },
            Region {
                byte_start: 6,
                byte_end: 9,
                anchor: Anchor {
                    sheet: Some("Q1".into()),
                    rows: Some((2, 7)),
                    section: vec!["Rates".into(), "Fixed".into()],
                    ..Anchor::default()
                },
                table_header: None,
            },
            Region {
                byte_start: 11,
                byte_end: 12,
                anchor: Anchor {
                    slide: Some(3),
                    ..Anchor::default()
                },
                table_header: None,
            },
        ];
        let mut bytes = b"text".to_vec();
        let tables = encode_regions(regions.clone(), &mut bytes);
        assert_eq!(
            (tables.paths.len(), tables.strings.len()),
            (2, 2),
            "{tables:?}"
        );
        let mut buf = Vec::new();
        let answer = Answer::Document {
            title: "T".into(),
            text_len: 4,
            regions: tables,
        };
        write_frame(&mut buf, &answer, &bytes).unwrap();
        let (a, got): (Answer, _) = read_frame(&mut buf.as_slice(), 1 << 10, 1 << 10).unwrap();
        assert_eq!(got, bytes);
        let Answer::Document {
            text_len,
            regions: t,
            ..
        } = a
        else {
            panic!("{a:?}")
        };
        assert_eq!(&got[..text_len], b"text");
        assert_eq!(decode_regions(&t, &got[text_len..]), Some(regions));
        // Truncated, trailing bytes, an index out of its table: refused, not misread.
        let blob = &got[text_len..];
        assert_eq!(decode_regions(&t, &blob[..blob.len() - 1]), None);
        assert_eq!(decode_regions(&t, &[blob, &[0]].concat()), None);
        let no_paths = RegionTables {
            paths: Vec::new(),
            ..t
        };
        assert_eq!(decode_regions(&no_paths, blob), None);
        assert!(matches!(
            read_frame::<Answer>(&mut buf.as_slice(), 8, 1 << 10),
            Err(FrameError::TooLong(_))
        ));
        assert!(matches!(
            read_frame::<Answer>(&mut buf.as_slice(), 1 << 10, 3),
            Err(FrameError::TooLong(_))
        ));
        assert!(matches!(
            read_frame::<Answer>(&mut &buf[..0], 1 << 10, 1 << 10),
            Err(FrameError::Eof)
        ));
        assert!(matches!(
            read_frame::<Answer>(&mut &buf[..6], 1 << 10, 1 << 10),
            Err(FrameError::Io(_))
        ));
    }
}
