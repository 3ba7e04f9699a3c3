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
    /// The extractor's limits.
    pub limits: ExtractLimits,
    /// CPU seconds this file may use.
    pub cpu_secs: u64,
}

/// A region of the extracted text ([`Region`] on the wire), its heading path an index into
/// the answer's table of paths (a path is shared by every block under a heading; repeating it
/// per region would make the answer of a long document several times its text). Short keys,
/// absent fields left out: a long PDF has thousands of regions.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WireRegion {
    /// First byte.
    #[serde(rename = "s")]
    pub start: usize,
    /// One past the last byte.
    #[serde(rename = "e")]
    pub end: usize,
    /// Page.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub page: Option<u32>,
    /// Sheet.
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub sheet: Option<String>,
    /// Row range.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<(u32, u32)>,
    /// Slide.
    #[serde(rename = "l", default, skip_serializing_if = "Option::is_none")]
    pub slide: Option<u32>,
    /// Index of the heading path in [`Answer::Document`]'s `paths`.
    #[serde(rename = "x")]
    pub path: usize,
    /// A table's header row.
    #[serde(rename = "t", default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
}

/// The regions of a document on the wire: the table of distinct heading paths and the regions
/// naming them.
pub fn encode_regions(regions: Vec<Region>) -> (Vec<Vec<String>>, Vec<WireRegion>) {
    let mut paths: Vec<Vec<String>> = Vec::new();
    let mut index: std::collections::HashMap<Vec<String>, usize> = Default::default();
    let wire = regions
        .into_iter()
        .map(|r| {
            let Anchor {
                page,
                sheet,
                rows,
                slide,
                section,
            } = r.anchor;
            let path = match index.get(&section) {
                Some(&i) => i,
                None => {
                    paths.push(section.clone());
                    index.insert(section, paths.len() - 1);
                    paths.len() - 1
                }
            };
            WireRegion {
                start: r.byte_start,
                end: r.byte_end,
                page,
                sheet,
                rows,
                slide,
                path,
                header: r.table_header,
            }
        })
        .collect();
    (paths, wire)
}

/// The regions of [`encode_regions`] back; `None` when one names a path that is not there.
pub fn decode_regions(paths: &[Vec<String>], wire: Vec<WireRegion>) -> Option<Vec<Region>> {
    wire.into_iter()
        .map(|w| {
            Some(Region {
                byte_start: w.start,
                byte_end: w.end,
                anchor: Anchor {
                    page: w.page,
                    sheet: w.sheet,
                    rows: w.rows,
                    slide: w.slide,
                    section: paths.get(w.path)?.clone(),
                },
                table_header: w.header,
            })
        })
        .collect()
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
    /// Extracted: the title and the regions of the text.
    Document {
        /// The title.
        title: String,
        /// The distinct heading paths the regions name.
        paths: Vec<Vec<String>>,
        /// The regions, in text order.
        regions: Vec<WireRegion>,
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
        let (paths, wire) = encode_regions(regions.clone());
        assert_eq!(paths.len(), 2, "{paths:?}");
        let mut buf = Vec::new();
        let answer = Answer::Document {
            title: "T".into(),
            paths,
            regions: wire,
        };
        write_frame(&mut buf, &answer, b"text").unwrap();
        let (a, text): (Answer, _) = read_frame(&mut buf.as_slice(), 1 << 10, 10).unwrap();
        assert_eq!(text, b"text");
        let Answer::Document {
            paths,
            regions: wire,
            ..
        } = a
        else {
            panic!("{a:?}")
        };
        assert_eq!(decode_regions(&paths, wire), Some(regions));
        assert_eq!(
            decode_regions(&[], vec![WireRegion::default()]),
            None,
            "a path that is not in the table"
        );
        assert!(matches!(
            read_frame::<Answer>(&mut buf.as_slice(), 8, 10),
            Err(FrameError::TooLong(_))
        ));
        assert!(matches!(
            read_frame::<Answer>(&mut buf.as_slice(), 1 << 10, 3),
            Err(FrameError::TooLong(4))
        ));
        assert!(matches!(
            read_frame::<Answer>(&mut &buf[..0], 1 << 10, 10),
            Err(FrameError::Eof)
        ));
        assert!(matches!(
            read_frame::<Answer>(&mut &buf[..6], 1 << 10, 10),
            Err(FrameError::Io(_))
        ));
    }
}
