//! The guards every OOXML file passes: a zip reader that counts entries and decompressed bytes
//! (declared sizes can lie, so actual bytes are counted while they are inflated), and an XML
//! walker that refuses any DTD (no entity is ever expanded: billion laughs has nothing to
//! expand) and deep nesting.
//!
//! Parts are never inflated into memory whole: [`Zip::walk_xml`] parses an entry as it is
//! inflated, so what a part costs is one XML event (at most `max_text_bytes`) and what the
//! extractor keeps of it, not its decompressed size.

use std::io::{BufRead, BufReader, Cursor, Read};

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

/// An entry's bytes as they are inflated, counted against what is left of the container's
/// budget and, while XML is parsed, against the size of one event. It stops (an I/O error the
/// caller turns into the refusal, [`Capped::tripped`]) at the first read past either.
struct Capped<R> {
    inner: R,
    /// Bytes of this entry consumed so far.
    read: u64,
    /// What is left of the container's budget when the entry was opened.
    left: u64,
    /// `read` when the current XML event began.
    event_start: u64,
    /// Largest XML event (`u64::MAX` when the entry is not parsed).
    max_event: u64,
}

/// Which cap a [`Capped`] reader hit.
enum Trip {
    Container,
    Event(u64),
}

impl<R: BufRead> Capped<R> {
    fn tripped(&self) -> Option<Trip> {
        if self.read > self.left {
            Some(Trip::Container)
        } else if self.read - self.event_start > self.max_event {
            Some(Trip::Event(self.read - self.event_start))
        } else {
            None
        }
    }
}

impl<R: BufRead> Read for Capped<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = {
            let buf = self.fill_buf()?;
            let n = buf.len().min(out.len());
            out[..n].copy_from_slice(&buf[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Capped<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.tripped().is_some() {
            return Err(std::io::Error::other("decompression cap reached"));
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.read += n as u64;
        self.inner.consume(n);
    }
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

    /// The refusal for a container that inflated past its budget.
    fn over_budget(&self) -> Refusal {
        if self.budget_name == "max_zip_ratio" {
            Refusal::limit(
                "max_zip_ratio",
                self.used / self.file_len.max(1),
                self.max_ratio,
            )
        } else {
            Refusal::limit("max_zip_bytes", self.used, self.budget)
        }
    }

    /// Runs `read` over entry `name` as it is inflated (`None`: no such entry), counting its
    /// actual decompressed bytes against the container's budget; `max_event` caps one XML
    /// event (see [`Capped`]).
    fn with_entry<T>(
        &mut self,
        name: &str,
        max_event: u64,
        read: impl FnOnce(&mut Capped<BufReader<&mut dyn Read>>) -> Result<T, Refusal>,
    ) -> Result<Option<T>, Refusal> {
        let format = self.format;
        let left = self.budget.saturating_sub(self.used);
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
        let mut capped = Capped {
            inner: BufReader::with_capacity(64 << 10, &mut entry as &mut dyn Read),
            read: 0,
            left,
            event_start: 0,
            max_event,
        };
        let r = read(&mut capped);
        let (read_bytes, trip) = (capped.read, capped.tripped());
        drop(capped);
        drop(entry);
        self.used += read_bytes;
        match trip {
            Some(Trip::Container) => Err(self.over_budget()),
            Some(Trip::Event(n)) => Err(Refusal::limit("max_text_bytes", n, max_event)),
            None => r.map(Some),
        }
    }

    /// Inflates entry `name` once, counting its bytes: walked as XML (see [`Zip::walk_xml`])
    /// when it starts, after a byte order mark and white space, with `<`; otherwise (an image,
    /// a binary blob) only counted.
    pub(crate) fn check_part(
        &mut self,
        name: &str,
        limits: &Limits,
        f: impl FnMut(Ev<'_, '_>) -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        let format = self.format;
        let io = |e: std::io::Error| Refusal::malformed(format, format!("zip entry {name}: {e}"));
        self.with_entry(name, limits.max_text_bytes, |r| {
            let head = r.fill_buf().map_err(io)?;
            let head = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(head);
            let xml = head
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                .is_none_or(|&b| b == b'<');
            if xml {
                walk_events(r, format, limits, f)
            } else {
                r.max_event = u64::MAX;
                std::io::copy(r, &mut std::io::sink())
                    .map(|_| ())
                    .map_err(io)
            }
        })
        .map(|_| ())
    }

    /// Walks XML entry `name` as it is inflated (see [`walk`]); false when there is no such
    /// entry. One event may be at most `max_text_bytes` long.
    pub(crate) fn walk_xml(
        &mut self,
        name: &str,
        limits: &Limits,
        f: impl FnMut(Ev<'_, '_>) -> Result<(), Refusal>,
    ) -> Result<bool, Refusal> {
        let format = self.format;
        self.with_entry(name, limits.max_text_bytes, |r| {
            walk_events(r, format, limits, f)
        })
        .map(|o| o.is_some())
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

/// The events of one XML part that extractors use.
pub(crate) enum Ev<'a, 'x> {
    Start(&'a BytesStart<'x>),
    Empty(&'a BytesStart<'x>),
    End(&'a [u8]),
    Text(&'a str),
}

/// A source [`walk_events`] reads: an inflating zip entry (whose event cap is reset per event)
/// or bytes in memory.
trait Source: BufRead {
    /// Called after each event.
    fn event_done(&mut self) {}
}

impl<R: BufRead> Source for Capped<R> {
    fn event_done(&mut self) {
        self.event_start = self.read;
    }
}

/// Walks XML from `source`, calling `f` per event, with text entity references resolved (only
/// the five predefined entities and character references; a DTD is refused, so there are no
/// others). Refuses element nesting deeper than `max_xml_depth` and more than `max_text_bytes`
/// of text in the part.
fn walk_events<S: Source>(
    source: &mut S,
    format: Format,
    limits: &Limits,
    mut f: impl FnMut(Ev<'_, '_>) -> Result<(), Refusal>,
) -> Result<(), Refusal> {
    let mut reader = Reader::from_reader(source);
    reader.config_mut().check_end_names = true;
    let mut depth: u32 = 0;
    let mut text: u64 = 0;
    let mut buf = Vec::new();
    let bad = |e: quick_xml::Error, pos: u64| {
        Refusal::malformed(format, format!("XML error at byte {pos}: {e}"))
    };
    let mut count_text = |n: usize| {
        text += n as u64;
        if text > limits.max_text_bytes {
            return Err(Refusal::limit(
                "max_text_bytes",
                text,
                limits.max_text_bytes,
            ));
        }
        Ok(())
    };
    loop {
        buf.clear();
        let ev = reader
            .read_event_into(&mut buf)
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
                count_text(s.len())?;
                f(Ev::Text(&s))?;
            }
            Event::CData(ref c) => {
                let s = c.xml10_content();
                count_text(s.len())?;
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
                    count_text(s.len())?;
                    f(Ev::Text(&s))?;
                }
            }
            Event::Eof => break,
            Event::Comment(_) | Event::Decl(_) | Event::PI(_) => {}
        }
        reader.get_mut().event_done();
    }
    Ok(())
}

/// `docProps/core.xml`'s `dc:title`.
pub(crate) fn core_title(zip: &mut Zip<'_>, limits: &Limits) -> Result<Option<String>, Refusal> {
    let mut in_title = false;
    let mut title = String::new();
    zip.walk_xml("docProps/core.xml", limits, |ev| {
        match ev {
            Ev::Start(s) if tag(s) == b"title" => in_title = true,
            Ev::End(n) if local(n) == b"title" => in_title = false,
            Ev::Text(t) if in_title => title.push_str(t),
            _ => {}
        }
        Ok(())
    })?;
    let t = title.trim();
    Ok((!t.is_empty()).then(|| t.to_owned()))
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
