//! The guards every OOXML file passes: a zip reader that counts entries and decompressed bytes
//! (declared sizes can lie, so actual bytes are counted), and an XML walker that refuses any
//! DTD (no entity is ever expanded: billion laughs has nothing to expand) and deep nesting.

use std::io::{Cursor, Read};

use quick_xml::Reader;
use quick_xml::events::{BytesStart, Event};

use crate::{Format, Limits, Refusal};

/// A zip container opened within limits.
pub(crate) struct Zip<'a> {
    archive: zip::ZipArchive<Cursor<&'a [u8]>>,
    format: Format,
    /// Decompressed bytes read so far.
    used: u64,
    /// Most decompressed bytes allowed in total.
    budget: u64,
    /// Which limit `budget` is.
    budget_name: &'static str,
    file_len: u64,
    max_ratio: u32,
}

impl<'a> Zip<'a> {
    pub(crate) fn open(bytes: &'a [u8], format: Format, limits: &Limits) -> Result<Self, Refusal> {
        if !bytes.starts_with(b"PK") {
            return Err(not_a_package(format, bytes));
        }
        let archive = zip::ZipArchive::new(Cursor::new(bytes))
            .map_err(|e| Refusal::malformed(format, format!("not a valid zip container: {e}")))?;
        if archive.len() as u64 > u64::from(limits.max_zip_entries) {
            return Err(Refusal::limit(
                "max_zip_entries",
                archive.len(),
                limits.max_zip_entries,
            ));
        }
        let declared = archive.decompressed_size().unwrap_or(u128::MAX);
        let declared = u64::try_from(declared).unwrap_or(u64::MAX);
        if declared > limits.max_zip_bytes {
            return Err(Refusal::limit(
                "max_zip_bytes",
                declared,
                limits.max_zip_bytes,
            ));
        }
        let ratio_cap = (bytes.len() as u64).saturating_mul(u64::from(limits.max_zip_ratio));
        let ratio = declared / (bytes.len() as u64).max(1);
        if declared > ratio_cap {
            return Err(Refusal::limit("max_zip_ratio", ratio, limits.max_zip_ratio));
        }
        let (budget, budget_name) = if ratio_cap < limits.max_zip_bytes {
            (ratio_cap, "max_zip_ratio")
        } else {
            (limits.max_zip_bytes, "max_zip_bytes")
        };
        Ok(Self {
            archive,
            format,
            used: 0,
            budget,
            budget_name,
            file_len: bytes.len() as u64,
            max_ratio: limits.max_zip_ratio,
        })
    }

    /// Entry names, in central-directory order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.archive
            .file_names()
            .filter_map(Result::ok)
            .map(|n| n.into_owned())
            .collect()
    }

    /// Reads entry `name`, if present, counting its actual decompressed size.
    pub(crate) fn read(&mut self, name: &str) -> Result<Option<Vec<u8>>, Refusal> {
        let format = self.format;
        let mut entry = match self.archive.by_name(name) {
            Ok(e) => e,
            Err(zip::result::ZipError::FileNotFound) => return Ok(None),
            Err(zip::result::ZipError::UnsupportedArchive(m)) if m.contains("ncrypt") => {
                return Err(Refusal::Encrypted);
            }
            Err(e) => return Err(Refusal::malformed(format, format!("zip entry {name}: {e}"))),
        };
        if entry.encrypted() {
            return Err(Refusal::Encrypted);
        }
        let left = self.budget.saturating_sub(self.used);
        let mut out = Vec::with_capacity(entry.size().min(left).min(1 << 24) as usize);
        (&mut entry)
            .take(left + 1)
            .read_to_end(&mut out)
            .map_err(|e| Refusal::malformed(format, format!("zip entry {name}: {e}")))?;
        self.used += out.len() as u64;
        if self.used > self.budget {
            return Err(if self.budget_name == "max_zip_ratio" {
                Refusal::limit(
                    "max_zip_ratio",
                    self.used / self.file_len.max(1),
                    self.max_ratio,
                )
            } else {
                Refusal::limit("max_zip_bytes", self.used, self.budget)
            });
        }
        Ok(Some(out))
    }

    /// Reads an XML entry as UTF-8, checked by [`check_xml`].
    pub(crate) fn read_xml(
        &mut self,
        name: &str,
        limits: &Limits,
    ) -> Result<Option<String>, Refusal> {
        let Some(bytes) = self.read(name)? else {
            return Ok(None);
        };
        let text = xml_text(bytes, self.format, name)?;
        check_xml(&text, self.format, limits)?;
        Ok(Some(text))
    }
}

/// An OLE compound file (legacy `.doc`/`.xls`/`.ppt`, or an encrypted OOXML file) or some other
/// non-zip input.
fn not_a_package(format: Format, bytes: &[u8]) -> Refusal {
    if bytes.starts_with(&[0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1]) {
        // Office puts a password-protected OOXML file into an OLE container ("EncryptedPackage").
        let needle = "EncryptedPackage"
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect::<Vec<_>>();
        if bytes.windows(needle.len()).any(|w| w == needle) {
            return Refusal::Encrypted;
        }
        return Refusal::Unsupported(
            "legacy binary Office files (.doc, .xls, .ppt) are not supported: save as .docx, .xlsx or .pptx",
        );
    }
    Refusal::malformed(format, "not a zip container")
}

fn xml_text(bytes: Vec<u8>, format: Format, name: &str) -> Result<String, Refusal> {
    let bytes = match bytes.strip_prefix(b"\xef\xbb\xbf") {
        Some(rest) => rest.to_vec(),
        None => bytes,
    };
    String::from_utf8(bytes).map_err(|e| {
        Refusal::malformed(
            format,
            format!("{name}: not UTF-8 at byte {}", e.utf8_error().valid_up_to()),
        )
    })
}

/// Refuses a DTD anywhere and element nesting deeper than `max_xml_depth`.
pub(crate) fn check_xml(xml: &str, format: Format, limits: &Limits) -> Result<(), Refusal> {
    walk(xml, format, limits, |_| Ok(()))
}

/// The events of one XML part that extractors use.
pub(crate) enum Ev<'a, 'x> {
    Start(&'a BytesStart<'x>),
    Empty(&'a BytesStart<'x>),
    End(&'a [u8]),
    Text(&'a str),
}

/// Walks `xml`, calling `f` per event, with text entity references resolved (only the five
/// predefined entities and character references; a DTD is refused, so there are no others).
pub(crate) fn walk<'x>(
    xml: &'x str,
    format: Format,
    limits: &Limits,
    mut f: impl FnMut(Ev<'_, 'x>) -> Result<(), Refusal>,
) -> Result<(), Refusal> {
    let mut reader = Reader::from_str(xml);
    reader.config_mut().check_end_names = true;
    let mut depth: u32 = 0;
    let bad = |e: quick_xml::Error, pos: u64| {
        Refusal::malformed(format, format!("XML error at byte {pos}: {e}"))
    };
    loop {
        let ev = reader
            .read_event()
            .map_err(|e| bad(e, reader.buffer_position()))?;
        match ev {
            Event::DocType(_) => {
                return Err(Refusal::malformed(
                    format,
                    "XML part declares a DTD (entity expansion is refused)",
                ));
            }
            Event::Start(ref s) => {
                depth += 1;
                if depth > limits.max_xml_depth {
                    return Err(Refusal::limit("max_xml_depth", depth, limits.max_xml_depth));
                }
                f(Ev::Start(s))?;
            }
            Event::Empty(ref s) => f(Ev::Empty(s))?,
            Event::End(ref e) => {
                depth = depth.saturating_sub(1);
                f(Ev::End(e.local_name().into_inner().as_bytes()))?;
            }
            Event::Text(ref t) => {
                let s = t.xml10_content();
                f(Ev::Text(&s))?;
            }
            Event::CData(ref c) => {
                let s = c.xml10_content();
                f(Ev::Text(&s))?;
            }
            Event::GeneralRef(ref r) => {
                let s: Option<String> = match r.resolve_char_ref() {
                    Ok(Some(c)) => Some(c.to_string()),
                    Ok(None) => match &*r.xml10_content() {
                        "amp" => Some("&".into()),
                        "lt" => Some("<".into()),
                        "gt" => Some(">".into()),
                        "quot" => Some("\"".into()),
                        "apos" => Some("'".into()),
                        _ => None,
                    },
                    Err(_) => None,
                };
                if let Some(s) = s {
                    f(Ev::Text(&s))?;
                }
            }
            Event::Eof => break,
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) => {}
        }
    }
    Ok(())
}

/// The local part of a qualified name (`w:p` → `p`).
pub(crate) fn local(name: &[u8]) -> &[u8] {
    match name.iter().position(|&b| b == b':') {
        Some(i) => &name[i + 1..],
        None => name,
    }
}

/// The local name of an element (`w:p` → `p`).
pub(crate) fn tag<'b>(s: &'b BytesStart<'_>) -> &'b [u8] {
    local(s.name().into_inner().as_bytes())
}

/// Attribute `key` (qualified name as written, or its local part) of `s`, unescaped.
pub(crate) fn attr(s: &BytesStart<'_>, key: &[u8]) -> Option<String> {
    s.attributes().flatten().find_map(|a| {
        let k = a.key.into_inner().as_bytes();
        (k == key || local(k) == key).then(|| {
            quick_xml::escape::unescape(&a.value)
                .map(|v| v.into_owned())
                .unwrap_or_else(|_| a.value.to_string())
        })
    })
}
