//! PDF: `lopdf` parses the file (bounded stream decompression, bounded object nesting); this
//! module interprets the page content streams itself to place every piece of text, then lays
//! the pieces out: lines, columns (read column by column), tables (rows of cells), paragraphs
//! (with end-of-line hyphenation joined), headings (by font size) — and drops the running
//! headers and footers that repeat on every page.

use std::collections::HashMap;
use std::rc::Rc;

use lopdf::content::{Content, Operation};
use lopdf::{Dictionary, Document, Encoding, LoadOptions, Object, ObjectId, Stream};

use crate::limits::Budget;
use crate::pdf_metrics::standard_widths;
use crate::{Anchor, Block, BlockKind, Extracted, Format, Limits, Refusal};

/// Most content-stream operations interpreted per page, the strings of a `TJ` array counted
/// one by one (a stream of millions of no-ops is bounded by the stream size limit already; this
/// bounds the CPU and the placed text of the rest).
const MAX_OPS_PER_PAGE: usize = 2_000_000;

/// Most inflated stream bytes kept for reuse (a form drawn again, a content stream shared by
/// pages); streams beyond are inflated again when drawn again, and counted again.
const STREAM_CACHE_BYTES: u64 = 64 << 20;

/// The refusal for a stream (or a page's content) inflating past `max_stream_bytes`.
fn stream_limit(limits: &Limits) -> Refusal {
    Refusal::limit(
        "max_stream_bytes",
        limits.max_stream_bytes + 1,
        limits.max_stream_bytes,
    )
}

fn err(e: lopdf::Error, limits: &Limits) -> Refusal {
    match e {
        lopdf::Error::Decompress(lopdf::DecompressError::MemoryLimitExceeded { .. }) => {
            stream_limit(limits)
        }
        lopdf::Error::Decryption(_) | lopdf::Error::InvalidPassword => Refusal::Encrypted,
        lopdf::Error::ReferenceLimit => Refusal::limit(
            "max_pdf_depth",
            limits.max_pdf_depth + 1,
            limits.max_pdf_depth,
        ),
        e => Refusal::malformed(Format::Pdf, e),
    }
}

pub(crate) fn extract(
    bytes: &[u8],
    limits: &Limits,
    budget: &mut Budget,
) -> Result<Extracted, Refusal> {
    let head = &bytes[..bytes.len().min(1024)];
    if !head.windows(5).any(|w| w == b"%PDF-") {
        return Err(Refusal::malformed(Format::Pdf, "no %PDF- header"));
    }
    let opts = LoadOptions {
        max_decompressed_size: Some(usize::try_from(limits.max_stream_bytes).unwrap_or(usize::MAX)),
        ..LoadOptions::default()
    };
    let doc = Document::load_mem_with_options(bytes, opts).map_err(|e| err(e, limits))?;
    if doc.is_encrypted() {
        return Err(Refusal::Encrypted);
    }
    let pages = doc.get_pages();
    if pages.is_empty() {
        return Err(Refusal::malformed(Format::Pdf, "no pages"));
    }
    if pages.len() as u64 > u64::from(limits.max_pages) {
        return Err(Refusal::limit("max_pages", pages.len(), limits.max_pages));
    }
    let mut page_lines = Vec::with_capacity(pages.len());
    let mut chars = 0usize;
    let mut images = 0usize;
    let mut shared = Shared::default();
    for (_, &id) in pages.iter() {
        let mut interp = Interp::new(&doc, limits, &mut shared);
        interp.page(id)?;
        images += interp.images;
        let text_bytes: usize = interp.items.iter().map(|i| i.text.len()).sum();
        chars += text_bytes;
        budget.text(text_bytes)?;
        let height = page_height(&doc, id);
        page_lines.push((lines(interp.items), height));
    }
    if chars == 0 {
        // Images but no text: a scan. Neither: damaged, or text drawn as outlines.
        return Err(if images > 0 {
            Refusal::NoTextLayer
        } else {
            Refusal::Empty
        });
    }
    // Text counted once as raw items above; the layout below only rearranges it.
    let mut relaxed = Budget::new(&Limits {
        max_text_bytes: u64::MAX,
        ..limits.clone()
    });
    drop_running_lines(&mut page_lines);
    let body = body_size(&page_lines);
    let heading_sizes = heading_sizes(&page_lines, body);
    let mut out = Extracted {
        title: info_title(&doc),
        units: pages.len() as u32,
        ..Extracted::default()
    };
    let mut sections: Vec<(u8, String)> = Vec::new();
    for (i, (lines, _)) in page_lines.into_iter().enumerate() {
        let page = (i + 1) as u32;
        let ordered = reading_order(lines);
        layout_blocks(
            ordered,
            page,
            body,
            &heading_sizes,
            &mut sections,
            &mut relaxed,
            &mut out.blocks,
        )?;
    }
    if out.title.is_none() {
        out.title = out.blocks.iter().find_map(|b| match b.kind {
            BlockKind::Heading(_) => Some(b.text.clone()),
            _ => None,
        });
    }
    Ok(out)
}

fn page_height(doc: &Document, id: ObjectId) -> f32 {
    let mut cur = doc.get_dictionary(id).ok();
    for _ in 0..16 {
        let Some(d) = cur else { break };
        if let Ok(Object::Array(a)) = d
            .get(b"MediaBox")
            .and_then(|o| doc.dereference(o).map(|(_, o)| o))
            && a.len() == 4
        {
            let n: Vec<f32> = a.iter().filter_map(num).collect();
            if n.len() == 4 {
                return (n[3] - n[1]).abs().max(1.0);
            }
        }
        cur = d
            .get(b"Parent")
            .and_then(Object::as_reference)
            .ok()
            .and_then(|p| doc.get_dictionary(p).ok());
    }
    792.0
}

fn info_title(doc: &Document) -> Option<String> {
    let info = doc.trailer.get(b"Info").ok()?;
    let (_, info) = doc.dereference(info).ok()?;
    let t = info.as_dict().ok()?.get(b"Title").ok()?;
    let (_, t) = doc.dereference(t).ok()?;
    let s = pdf_string(t.as_str().ok()?);
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// A PDF text string: UTF-16BE with BOM, UTF-8 with BOM, else PDFDocEncoding (≈ Latin-1).
fn pdf_string(b: &[u8]) -> String {
    if let Some(rest) = b.strip_prefix(&[0xFE, 0xFF]) {
        let units: Vec<u16> = rest
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        return String::from_utf16_lossy(&units);
    }
    if let Some(rest) = b.strip_prefix(&[0xEF, 0xBB, 0xBF]) {
        return String::from_utf8_lossy(rest).into_owned();
    }
    b.iter().map(|&c| c as char).collect()
}

fn num(o: &Object) -> Option<f32> {
    match o {
        Object::Integer(i) => Some(*i as f32),
        Object::Real(r) => Some(*r),
        _ => None,
    }
}

// --- content interpretation ------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
struct M([f32; 6]);

impl M {
    const ID: M = M([1.0, 0.0, 0.0, 1.0, 0.0, 0.0]);

    /// `self` then `o`.
    fn then(self, o: M) -> M {
        let [a1, b1, c1, d1, e1, f1] = self.0;
        let [a2, b2, c2, d2, e2, f2] = o.0;
        M([
            a1 * a2 + b1 * c2,
            a1 * b2 + b1 * d2,
            c1 * a2 + d1 * c2,
            c1 * b2 + d1 * d2,
            e1 * a2 + f1 * c2 + e2,
            e1 * b2 + f1 * d2 + f2,
        ])
    }

    fn apply(self, x: f32, y: f32) -> (f32, f32) {
        let [a, b, c, d, e, f] = self.0;
        (a * x + c * y + e, b * x + d * y + f)
    }

    fn translate(x: f32, y: f32) -> M {
        M([1.0, 0.0, 0.0, 1.0, x, y])
    }

    fn from_operands(ops: &[Object]) -> Option<M> {
        if ops.len() != 6 {
            return None;
        }
        let v: Vec<f32> = ops.iter().filter_map(num).collect();
        (v.len() == 6 && v.iter().all(|x| x.is_finite()))
            .then(|| M([v[0], v[1], v[2], v[3], v[4], v[5]]))
    }
}

/// A placed piece of text (device space, y up).
#[derive(Debug, Clone)]
struct Item {
    x: f32,
    x_end: f32,
    y: f32,
    size: f32,
    bold: bool,
    text: String,
}

enum Widths {
    Simple {
        first: i64,
        w: Vec<f32>,
        missing: f32,
    },
    Standard(&'static [u16; 256]),
    Cid {
        dw: f32,
        w: HashMap<u32, f32>,
    },
    Fixed(f32),
}

struct Font<'a> {
    encoding: Option<Encoding<'a>>,
    widths: Widths,
    two_byte: bool,
    bold: bool,
}

impl Font<'_> {
    fn width(&self, code: u32) -> f32 {
        match &self.widths {
            Widths::Simple { first, w, missing } => {
                let i = i64::from(code) - first;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| w.get(i))
                    .copied()
                    .unwrap_or(*missing)
            }
            Widths::Standard(t) => t.get(code as usize).map_or(500.0, |&w| f32::from(w)),
            Widths::Cid { dw, w } => w.get(&code).copied().unwrap_or(*dw),
            Widths::Fixed(w) => *w,
        }
    }

    fn decode(&self, bytes: &[u8]) -> String {
        match &self.encoding {
            Some(enc) => Document::decode_text(enc, bytes).unwrap_or_default(),
            None => bytes
                .iter()
                .filter(|b| b.is_ascii_graphic() || **b == b' ')
                .map(|&b| b as char)
                .collect(),
        }
    }
}

#[derive(Clone)]
struct TextState {
    size: f32,
    char_space: f32,
    word_space: f32,
    hscale: f32,
    leading: f32,
    rise: f32,
    font: Option<Vec<u8>>,
}

/// The graphics and text state while one content stream is interpreted.
struct RunState {
    ctm: M,
    gstack: Vec<(M, TextState)>,
    ts: TextState,
    font_id: Option<ObjectId>,
    tm: M,
    tlm: M,
}

impl RunState {
    fn new(ctm: M) -> Self {
        Self {
            ctm,
            gstack: Vec::new(),
            ts: TextState {
                size: 0.0,
                char_space: 0.0,
                word_space: 0.0,
                hscale: 1.0,
                leading: 0.0,
                rise: 0.0,
                font: None,
            },
            font_id: None,
            tm: M::ID,
            tlm: M::ID,
        }
    }
}

/// What the pages of one file share: fonts and inflated streams by object id (a form drawn
/// on every page, or a hundred times on one, is inflated once), and the content interpreted so
/// far.
#[derive(Default)]
struct Shared<'a> {
    fonts: HashMap<ObjectId, Font<'a>>,
    /// Inflated streams (`None`: the stream could not be inflated).
    streams: HashMap<ObjectId, Option<Rc<Vec<u8>>>>,
    /// Bytes held in `streams`.
    cached: u64,
    /// Content-stream bytes interpreted so far, a form counted each time it is drawn.
    content: u64,
    /// Text placed so far.
    text: u64,
    /// Streams inflated (not taken from the cache).
    inflated: usize,
}

struct Interp<'a, 's> {
    doc: &'a Document,
    limits: &'a Limits,
    shared: &'s mut Shared<'a>,
    items: Vec<Item>,
    ops: usize,
    /// Images drawn (image XObjects and inline images).
    images: usize,
    /// Form XObjects being drawn (a cycle or a too deep chain is a refusal).
    stack: Vec<ObjectId>,
}

/// The object id of a direct object (never cached).
const DIRECT: ObjectId = (u32::MAX, 0);

impl<'a, 's> Interp<'a, 's> {
    fn new(doc: &'a Document, limits: &'a Limits, shared: &'s mut Shared<'a>) -> Self {
        // A font given directly (not by reference) has no id to cache it by: kept for one page.
        shared.fonts.remove(&DIRECT);
        Self {
            doc,
            limits,
            shared,
            items: Vec::new(),
            ops: 0,
            images: 0,
            stack: Vec::new(),
        }
    }

    /// Stream `id` inflated within `limit` bytes (`None`: it cannot be inflated), from the
    /// cache when it was inflated before.
    fn inflate(
        &mut self,
        id: ObjectId,
        stream: &Stream,
        limit: u64,
    ) -> Result<Option<Rc<Vec<u8>>>, Refusal> {
        if let Some(hit) = self.shared.streams.get(&id) {
            if hit.as_ref().is_some_and(|d| d.len() as u64 > limit) {
                return Err(stream_limit(self.limits));
            }
            return Ok(hit.clone());
        }
        self.shared.inflated += 1;
        let data = match stream
            .decompressed_content_with_limit(usize::try_from(limit).unwrap_or(usize::MAX))
            .map_err(|e| err(e, self.limits))
        {
            Ok(d) => Some(Rc::new(d)),
            Err(r @ Refusal::LimitExceeded { .. }) => return Err(r),
            Err(_) => None,
        };
        let size = data.as_ref().map_or(0, |d| d.len() as u64);
        if id != DIRECT && self.shared.cached + size <= STREAM_CACHE_BYTES {
            self.shared.cached += size;
            self.shared.streams.insert(id, data.clone());
        }
        Ok(data)
    }

    fn page(&mut self, id: ObjectId) -> Result<(), Refusal> {
        let doc = self.doc;
        let mut parts = Vec::new();
        let mut total = 0u64;
        for cid in doc.get_page_contents(id) {
            let Ok(Object::Stream(s)) = doc.get_object(cid) else {
                continue;
            };
            let left = self.limits.max_stream_bytes.saturating_sub(total);
            if let Some(part) = self.inflate(cid, s, left)? {
                total += part.len() as u64 + 1;
                parts.push(part);
            }
        }
        let data = if parts.len() == 1 {
            parts.pop().unwrap_or_default()
        } else {
            let mut data = Vec::with_capacity(total as usize);
            for p in &parts {
                data.extend_from_slice(p);
                data.push(b'\n');
            }
            Rc::new(data)
        };
        let resources = page_resources(doc, id);
        self.run(&data, &resources, M::ID)
    }

    fn font(
        &mut self,
        resources: &[&'a Dictionary],
        name: &[u8],
    ) -> Result<Option<ObjectId>, Refusal> {
        let doc = self.doc;
        for res in resources {
            let Ok(fonts) = res.get_deref(b"Font", doc).and_then(Object::as_dict) else {
                continue;
            };
            let Ok(obj) = fonts.get(name) else { continue };
            let (id, obj) = doc.dereference(obj).map_err(|e| err(e, self.limits))?;
            let Ok(dict) = obj.as_dict() else { continue };
            let id = id.unwrap_or(DIRECT);
            if !self.shared.fonts.contains_key(&id) {
                let f = load_font(doc, dict, self.limits)?;
                self.shared.fonts.insert(id, f);
            }
            return Ok(Some(id));
        }
        Ok(None)
    }

    fn run(&mut self, data: &[u8], resources: &[&'a Dictionary], ctm0: M) -> Result<(), Refusal> {
        let limits = self.limits;
        self.shared.content += data.len() as u64;
        if self.shared.content > limits.max_pdf_content_bytes {
            return Err(Refusal::limit(
                "max_pdf_content_bytes",
                self.shared.content,
                limits.max_pdf_content_bytes,
            ));
        }
        check_operands(data, limits.max_pdf_operands)?;
        let mut st = RunState::new(ctm0);
        for op in Content::decode_iter(data) {
            let Ok(op) = op else { break };
            self.ops += 1;
            if self.ops > MAX_OPS_PER_PAGE {
                break;
            }
            self.op(&op, &mut st, resources)?;
        }
        Ok(())
    }

    /// One content-stream operation: graphics and text state, text shown, images counted,
    /// forms drawn.
    fn op(
        &mut self,
        op: &Operation,
        st: &mut RunState,
        resources: &[&'a Dictionary],
    ) -> Result<(), Refusal> {
        let o = &op.operands;
        let f = |i: usize| o.get(i).and_then(num).unwrap_or(0.0);
        match op.operator.as_str() {
            "q" if st.gstack.len() < 256 => st.gstack.push((st.ctm, st.ts.clone())),
            "Q" => {
                if let Some((c, t)) = st.gstack.pop() {
                    st.ctm = c;
                    st.ts = t;
                    st.font_id = match &st.ts.font {
                        Some(n) => self.font(resources, n)?,
                        None => None,
                    };
                }
            }
            "cm" => {
                if let Some(m) = M::from_operands(o) {
                    st.ctm = m.then(st.ctm);
                }
            }
            "BT" => {
                st.tm = M::ID;
                st.tlm = M::ID;
            }
            "Tf" => {
                if let Some(Object::Name(n)) = o.first() {
                    st.ts.font = Some(n.clone());
                    st.font_id = self.font(resources, n)?;
                }
                st.ts.size = f(1);
            }
            "Tc" => st.ts.char_space = f(0),
            "Tw" => st.ts.word_space = f(0),
            "Tz" => st.ts.hscale = f(0) / 100.0,
            "TL" => st.ts.leading = f(0),
            "Ts" => st.ts.rise = f(0),
            "Td" => {
                st.tlm = M::translate(f(0), f(1)).then(st.tlm);
                st.tm = st.tlm;
            }
            "TD" => {
                st.ts.leading = -f(1);
                st.tlm = M::translate(f(0), f(1)).then(st.tlm);
                st.tm = st.tlm;
            }
            "Tm" => {
                if let Some(m) = M::from_operands(o) {
                    st.tm = m;
                    st.tlm = m;
                }
            }
            "T*" => {
                st.tlm = M::translate(0.0, -st.ts.leading).then(st.tlm);
                st.tm = st.tlm;
            }
            "Tj" | "'" | "\"" | "TJ" => return self.show_text(op, st),
            "BI" | "ID" | "EI" => self.images += 1,
            "Do" => {
                if let Some(Object::Name(n)) = o.first() {
                    self.form(resources, n, st.ctm)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `Tj`, `'`, `"` and `TJ`: the strings placed (each counted as an operation, their text
    /// against `max_text_bytes`), the `TJ` adjustments applied.
    fn show_text(&mut self, op: &Operation, st: &mut RunState) -> Result<(), Refusal> {
        let limits = self.limits;
        let o = &op.operands;
        let f = |i: usize| o.get(i).and_then(num).unwrap_or(0.0);
        if op.operator == "'" || op.operator == "\"" {
            if op.operator == "\"" {
                st.ts.word_space = f(0);
                st.ts.char_space = f(1);
            }
            st.tlm = M::translate(0.0, -st.ts.leading).then(st.tlm);
            st.tm = st.tlm;
        }
        let parts: Vec<&Object> = match (op.operator.as_str(), o.last()) {
            ("TJ", Some(Object::Array(a))) => a.iter().collect(),
            (_, Some(s)) => vec![s],
            _ => return Ok(()),
        };
        for p in parts {
            match p {
                Object::String(bytes, _) => {
                    self.ops += 1;
                    if self.ops > MAX_OPS_PER_PAGE {
                        break;
                    }
                    let font = st.font_id.and_then(|id| self.shared.fonts.get(&id));
                    let (item, next) = show(bytes, font, &st.ts, st.tm, st.ctm);
                    st.tm = next;
                    if let Some(item) = item {
                        self.shared.text += item.text.len() as u64;
                        if self.shared.text > limits.max_text_bytes {
                            return Err(Refusal::limit(
                                "max_text_bytes",
                                self.shared.text,
                                limits.max_text_bytes,
                            ));
                        }
                        self.items.push(item);
                    }
                }
                other => {
                    if let Some(adj) = num(other) {
                        let tx = -adj / 1000.0 * st.ts.size * st.ts.hscale;
                        st.tm = M::translate(tx, 0.0).then(st.tm);
                    }
                }
            }
        }
        Ok(())
    }

    fn form(&mut self, resources: &[&'a Dictionary], name: &[u8], ctm: M) -> Result<(), Refusal> {
        let doc = self.doc;
        for res in resources {
            let Ok(xobjects) = res.get_deref(b"XObject", doc).and_then(Object::as_dict) else {
                continue;
            };
            let Ok(obj) = xobjects.get(name) else {
                continue;
            };
            let (id, obj) = doc.dereference(obj).map_err(|e| err(e, self.limits))?;
            let Ok(stream) = obj.as_stream() else {
                return Ok(());
            };
            match stream.dict.get(b"Subtype").and_then(Object::as_name).ok() {
                Some(b"Form") => {}
                Some(b"Image") => {
                    self.images += 1;
                    return Ok(());
                }
                _ => return Ok(()),
            }
            let id = id.unwrap_or(DIRECT);
            if self.stack.len() as u32 >= self.limits.max_pdf_depth || self.stack.contains(&id) {
                return Err(Refusal::limit(
                    "max_pdf_depth",
                    self.limits.max_pdf_depth + 1,
                    self.limits.max_pdf_depth,
                ));
            }
            let Some(data) = self.inflate(id, stream, self.limits.max_stream_bytes)? else {
                return Ok(());
            };
            let matrix = match stream.dict.get(b"Matrix") {
                Ok(Object::Array(a)) => M::from_operands(a).unwrap_or(M::ID),
                _ => M::ID,
            };
            let mut res: Vec<&'a Dictionary> = Vec::new();
            if let Ok(own) = stream
                .dict
                .get_deref(b"Resources", doc)
                .and_then(Object::as_dict)
            {
                res.push(own);
            }
            res.extend_from_slice(resources);
            self.stack.push(id);
            let r = self.run(&data, &res, matrix.then(ctm));
            self.stack.pop();
            return r;
        }
        Ok(())
    }
}

/// Refuses content in which one operation has more than `max` operand tokens (the elements of
/// an array or dictionary operand counted one by one): the content parser would hold them all
/// as objects before the operation could be looked at, tens of bytes per token of input.
/// A linear scan over the bytes, following the content grammar only as far as operands go
/// (strings, comments, arrays, dictionaries, inline image data).
fn check_operands(data: &[u8], max: u32) -> Result<(), Refusal> {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0c' | b'\0');
    let is_delim = |b: u8| {
        matches!(
            b,
            b'(' | b')' | b'<' | b'>' | b'[' | b']' | b'{' | b'}' | b'/' | b'%'
        )
    };
    let n = data.len();
    let (mut i, mut depth, mut count) = (0usize, 0u32, 0u64);
    let token = |count: &mut u64| {
        *count += 1;
        if *count > u64::from(max) {
            Err(Refusal::limit("max_pdf_operands", *count, max))
        } else {
            Ok(())
        }
    };
    while i < n {
        let b = data[i];
        if is_space(b) {
            i += 1;
            continue;
        }
        match b {
            b'%' => {
                while i < n && data[i] != b'\n' && data[i] != b'\r' {
                    i += 1;
                }
            }
            b'(' => {
                let mut nest = 0u32;
                while i < n {
                    match data[i] {
                        b'\\' => i += 1,
                        b'(' => nest += 1,
                        b')' => {
                            nest -= 1;
                            if nest == 0 {
                                i += 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                token(&mut count)?;
            }
            b'<' if data.get(i + 1) == Some(&b'<') => {
                i += 2;
                depth += 1;
                token(&mut count)?;
            }
            b'<' => {
                while i < n && data[i] != b'>' {
                    i += 1;
                }
                i += 1;
                token(&mut count)?;
            }
            b'>' if data.get(i + 1) == Some(&b'>') => {
                i += 2;
                depth = depth.saturating_sub(1);
            }
            b'[' => {
                i += 1;
                depth += 1;
                token(&mut count)?;
            }
            b']' => {
                i += 1;
                depth = depth.saturating_sub(1);
            }
            b'/' => {
                i += 1;
                while i < n && !is_space(data[i]) && !is_delim(data[i]) {
                    i += 1;
                }
                token(&mut count)?;
            }
            _ if is_delim(b) => i += 1,
            _ => {
                let start = i;
                while i < n && !is_space(data[i]) && !is_delim(data[i]) {
                    i += 1;
                }
                let word = &data[start..i];
                let operand = depth > 0
                    || matches!(word[0], b'0'..=b'9' | b'+' | b'-' | b'.')
                    || matches!(word, b"true" | b"false" | b"null");
                if operand {
                    token(&mut count)?;
                    continue;
                }
                count = 0;
                if word == b"ID" {
                    // Inline image data: raw bytes up to the first `EI` between white space.
                    i += 1;
                    while i < n {
                        if data[i..].starts_with(b"EI")
                            && data[i - 1..i].iter().all(|&c| is_space(c))
                            && data.get(i + 2).is_none_or(|&c| is_space(c))
                        {
                            break;
                        }
                        i += 1;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Shows one string: the placed text, if any, and the text matrix after it.
fn show(bytes: &[u8], font: Option<&Font<'_>>, ts: &TextState, tm: M, ctm: M) -> (Option<Item>, M) {
    {
        let two = font.is_some_and(|f| f.two_byte);
        let mut advance = 0.0f32;
        let codes: Vec<u32> = if two {
            bytes
                .chunks(2)
                .map(|c| (u32::from(c[0]) << 8) | u32::from(*c.get(1).unwrap_or(&0)))
                .collect()
        } else {
            bytes.iter().map(|&b| u32::from(b)).collect()
        };
        for &c in &codes {
            let w = font.map_or(500.0, |f| f.width(c));
            let mut a = w / 1000.0 * ts.size + ts.char_space;
            if !two && c == 32 {
                a += ts.word_space;
            }
            advance += a * ts.hscale;
        }
        let text = match font {
            Some(f) => f.decode(bytes),
            None => String::from_utf8_lossy(bytes).into_owned(),
        };
        let trm = tm.then(ctm);
        let (x, y) = trm.apply(0.0, ts.rise);
        let after = M::translate(advance, 0.0).then(tm);
        let (x_end, _) = after.then(ctm).apply(0.0, ts.rise);
        let [_, b, _, d, _, _] = trm.0;
        let size = (ts.size * (b * b + d * d).sqrt()).abs();
        let text: String = text
            .chars()
            .filter(|c| !c.is_control() || *c == '\t')
            .map(|c| if c == '\t' || c == '\u{a0}' { ' ' } else { c })
            .collect();
        let item = (!text.trim().is_empty() && x.is_finite() && y.is_finite() && x_end.is_finite())
            .then(|| Item {
                x: x.min(x_end),
                x_end: x.max(x_end),
                y,
                size: if size.is_finite() && size > 0.1 {
                    size
                } else {
                    10.0
                },
                bold: font.is_some_and(|f| f.bold),
                text,
            });
        (item, after)
    }
}

/// The resource dictionaries of a page, nearest first (inherited ones after).
fn page_resources(doc: &Document, id: ObjectId) -> Vec<&Dictionary> {
    let mut out = Vec::new();
    if let Ok((own, inherited)) = doc.get_page_resources(id) {
        if let Some(d) = own {
            out.push(d);
        }
        for rid in inherited {
            if let Ok(d) = doc.get_dictionary(rid) {
                out.push(d);
            }
        }
    }
    out
}

fn load_font<'a>(
    doc: &'a Document,
    dict: &'a Dictionary,
    limits: &Limits,
) -> Result<Font<'a>, Refusal> {
    let max = usize::try_from(limits.max_stream_bytes).unwrap_or(usize::MAX);
    let subtype = dict
        .get(b"Subtype")
        .and_then(Object::as_name)
        .unwrap_or(b"");
    let base = dict
        .get(b"BaseFont")
        .and_then(Object::as_name)
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .unwrap_or_default();
    let bold =
        base.to_ascii_lowercase().contains("bold") || base.to_ascii_lowercase().contains("black");
    if subtype == b"Type0" {
        // Two-byte codes; text through /ToUnicode (lopdf would try /Encoding first).
        let encoding = match dict
            .get_deref(b"ToUnicode", doc)
            .and_then(Object::as_stream)
        {
            Ok(_) => {
                let mut d = dict.clone();
                d.remove(b"Encoding");
                match d.get_font_encoding_with_limit(doc, max) {
                    Ok(Encoding::UnicodeMapEncoding(m)) => Some(Encoding::UnicodeMapEncoding(m)),
                    Err(e @ lopdf::Error::Decompress(_)) => return Err(err(e, limits)),
                    _ => None,
                }
            }
            Err(_) => None,
        };
        let (dw, w) = cid_widths(doc, dict);
        return Ok(Font {
            encoding,
            widths: Widths::Cid { dw, w },
            two_byte: true,
            bold,
        });
    }
    let encoding = match dict.get_font_encoding_with_limit(doc, max) {
        Ok(e) => Some(e),
        Err(e @ lopdf::Error::Decompress(_)) => return Err(err(e, limits)),
        Err(_) => None,
    };
    Ok(Font {
        encoding,
        widths: simple_widths(doc, dict, &base),
        two_byte: false,
        bold,
    })
}

/// A Type0 font's default width and per-code widths (`/DW` and `/W` of its first descendant
/// font), at most 65,536 codes.
fn cid_widths(doc: &Document, dict: &Dictionary) -> (f32, HashMap<u32, f32>) {
    let mut dw = 1000.0;
    let mut w = HashMap::new();
    if let Ok(Object::Array(desc)) = dict.get_deref(b"DescendantFonts", doc)
        && let Some(first) = desc.first()
        && let Ok((_, d)) = doc.dereference(first)
        && let Ok(d) = d.as_dict()
    {
        dw = d.get(b"DW").ok().and_then(num).unwrap_or(1000.0);
        if let Ok(Object::Array(arr)) = d.get_deref(b"W", doc) {
            let mut i = 0;
            while i + 1 < arr.len() && w.len() < 65_536 {
                let Some(c0) = num(&arr[i]) else { break };
                match doc.dereference(&arr[i + 1]).map(|(_, o)| o) {
                    Ok(Object::Array(ws)) => {
                        for (k, x) in ws.iter().enumerate().take(65_536) {
                            if let Some(x) = num(x) {
                                w.insert(c0 as u32 + k as u32, x);
                            }
                        }
                        i += 2;
                    }
                    Ok(o) => {
                        let (Some(c1), Some(x)) = (num(o), arr.get(i + 2).and_then(num)) else {
                            break;
                        };
                        let (c0, c1) = (c0 as u32, (c1 as u32).min(c0 as u32 + 65_536));
                        for c in c0..=c1 {
                            w.insert(c, x);
                        }
                        i += 3;
                    }
                    Err(_) => break,
                }
            }
        }
    }
    (dw, w)
}

/// A simple font's widths: `/Widths` from `/FirstChar`, else the standard font's table, else a
/// fixed width (600 for Courier, 500 otherwise).
fn simple_widths(doc: &Document, dict: &Dictionary, base: &str) -> Widths {
    match (
        dict.get_deref(b"Widths", doc),
        dict.get(b"FirstChar").ok().and_then(num),
    ) {
        (Ok(Object::Array(w)), Some(first)) => {
            let missing = dict
                .get_deref(b"FontDescriptor", doc)
                .and_then(Object::as_dict)
                .ok()
                .and_then(|fd| fd.get(b"MissingWidth").ok().and_then(num))
                .unwrap_or(500.0);
            Widths::Simple {
                first: first as i64,
                w: w.iter()
                    .take(65_536)
                    .map(|x| {
                        doc.dereference(x)
                            .ok()
                            .and_then(|(_, o)| num(o))
                            .unwrap_or(missing)
                    })
                    .collect(),
                missing,
            }
        }
        _ => match standard_widths(base) {
            Some(t) => Widths::Standard(t),
            None => Widths::Fixed(if base.to_ascii_lowercase().contains("courier") {
                600.0
            } else {
                500.0
            }),
        },
    }
}

// --- layout ----------------------------------------------------------------------------------

/// A run of text on one line with no wide gap inside.
#[derive(Debug, Clone)]
struct Seg {
    x0: f32,
    x1: f32,
    text: String,
}

#[derive(Debug, Clone)]
struct Line {
    y: f32,
    size: f32,
    bold: bool,
    segs: Vec<Seg>,
    /// 0 = full width, 1 = left column, 2 = right column.
    column: u8,
}

impl Line {
    fn text(&self) -> String {
        self.segs
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

/// Groups items into lines (top to bottom) and each line into segments.
fn lines(mut items: Vec<Item>) -> Vec<Line> {
    items.sort_by(|a, b| b.y.total_cmp(&a.y).then(a.x.total_cmp(&b.x)));
    let mut groups: Vec<Vec<Item>> = Vec::new();
    for it in items {
        match groups.last_mut() {
            Some(g) if (g[0].y - it.y).abs() <= 0.4 * g[0].size.max(it.size) => g.push(it),
            _ => groups.push(vec![it]),
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            g.sort_by(|a, b| a.x.total_cmp(&b.x));
            let size = g.iter().map(|i| i.size).fold(0.0, f32::max);
            let chars: usize = g.iter().map(|i| i.text.len()).sum();
            let bold_chars: usize = g.iter().filter(|i| i.bold).map(|i| i.text.len()).sum();
            let y = g[0].y;
            let mut segs: Vec<Seg> = Vec::new();
            let mut prev: Option<&Item> = None;
            for it in &g {
                if let Some(p) = prev
                    && (it.x - p.x).abs() < 0.5
                    && it.text == p.text
                {
                    continue; // the same text drawn twice (fake bold, shadow)
                }
                let gap = prev.map_or(f32::MAX, |p| it.x - p.x_end);
                match segs.last_mut() {
                    Some(s) if gap <= 1.0 * it.size.max(1.0) => {
                        if gap > 0.12 * it.size
                            && !s.text.ends_with(' ')
                            && !it.text.starts_with(' ')
                        {
                            s.text.push(' ');
                        }
                        s.text.push_str(&it.text);
                        s.x1 = s.x1.max(it.x_end);
                    }
                    _ => segs.push(Seg {
                        x0: it.x,
                        x1: it.x_end,
                        text: it.text.clone(),
                    }),
                }
                prev = Some(it);
            }
            for s in &mut segs {
                s.text = s.text.split_whitespace().collect::<Vec<_>>().join(" ");
            }
            segs.retain(|s| !s.text.is_empty());
            Line {
                y,
                size,
                bold: bold_chars * 2 > chars,
                segs,
                column: 0,
            }
        })
        .filter(|l| !l.segs.is_empty())
        .collect()
}

/// Normalised text of a running header/footer candidate: case and digits ignored.
fn running_key(l: &Line) -> String {
    l.text()
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_digit() { '#' } else { c })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// A line that starts a table (it and the next line both have the same number ≥ 2 of cells):
/// a table's repeated header row is content, not a running header.
fn starts_table(lines: &[Line], i: usize) -> bool {
    let n = lines[i].segs.len();
    n >= 2 && lines.get(i + 1).is_some_and(|l| l.segs.len() == n)
}

/// Drops lines among the first/last two of a page whose normalised text recurs there on at
/// least half of the pages (at least two).
fn drop_running_lines(pages: &mut [(Vec<Line>, f32)]) {
    if pages.len() < 2 {
        return;
    }
    let mut top: HashMap<String, usize> = HashMap::new();
    let mut bottom: HashMap<String, usize> = HashMap::new();
    for (lines, _) in pages.iter() {
        let mut seen_t = std::collections::HashSet::new();
        let mut seen_b = std::collections::HashSet::new();
        for i in 0..lines.len().min(2) {
            if !starts_table(lines, i) {
                seen_t.insert(running_key(&lines[i]));
            }
        }
        for l in &lines[lines.len().saturating_sub(2)..] {
            seen_b.insert(running_key(l));
        }
        for k in seen_t {
            *top.entry(k).or_default() += 1;
        }
        for k in seen_b {
            *bottom.entry(k).or_default() += 1;
        }
    }
    let need = pages.len().div_ceil(2).max(2);
    for (lines, _) in pages.iter_mut() {
        let n = lines.len();
        let mut drop = vec![false; n];
        for i in 0..n.min(2) {
            if !starts_table(lines, i)
                && top.get(&running_key(&lines[i])).is_some_and(|&c| c >= need)
            {
                drop[i] = true;
            }
        }
        for i in n.saturating_sub(2)..n {
            if bottom
                .get(&running_key(&lines[i]))
                .is_some_and(|&c| c >= need)
            {
                drop[i] = true;
            }
        }
        let mut i = 0;
        lines.retain(|_| {
            i += 1;
            !drop[i - 1]
        });
    }
}

/// Reorders a page's lines for reading: where the page has two columns (a gutter no line
/// crosses, prose on both sides), each band of two-column lines is read left column first.
fn reading_order(lines: Vec<Line>) -> Vec<Line> {
    let Some(g) = gutter(&lines) else {
        return lines;
    };
    let crosses = |l: &Line| l.segs.iter().any(|s| s.x0 < g && s.x1 > g);
    let mut out = Vec::with_capacity(lines.len() * 2);
    let mut left: Vec<Line> = Vec::new();
    let mut right: Vec<Line> = Vec::new();
    let flush = |out: &mut Vec<Line>, left: &mut Vec<Line>, right: &mut Vec<Line>| {
        out.append(left);
        out.append(right);
    };
    for l in lines {
        if crosses(&l) {
            flush(&mut out, &mut left, &mut right);
            out.push(l);
            continue;
        }
        let (ls, rs): (Vec<Seg>, Vec<Seg>) = l.segs.iter().cloned().partition(|s| s.x1 <= g);
        if !ls.is_empty() {
            left.push(Line {
                segs: ls,
                column: 1,
                ..l.clone()
            });
        }
        if !rs.is_empty() {
            right.push(Line {
                segs: rs,
                column: 2,
                ..l
            });
        }
    }
    flush(&mut out, &mut left, &mut right);
    out
}

/// The x of a column gutter: inside the gap of at least 3 two-segment lines, crossed by no
/// more than a few lines, with prose (segments filling most of their column) on both sides.
fn gutter(lines: &[Line]) -> Option<f32> {
    let left = lines
        .iter()
        .flat_map(|l| l.segs.iter().map(|s| s.x0))
        .fold(f32::MAX, f32::min);
    let right = lines
        .iter()
        .flat_map(|l| l.segs.iter().map(|s| s.x1))
        .fold(f32::MIN, f32::max);
    let width = right - left;
    if width <= 0.0 {
        return None;
    }
    let two: Vec<&Line> = lines.iter().filter(|l| l.segs.len() == 2).collect();
    if two.len() < 3 {
        return None;
    }
    let mut best: Option<(usize, f32)> = None;
    for l in &two {
        let g = (l.segs[0].x1 + l.segs[1].x0) / 2.0;
        if g < left + 0.25 * width || g > left + 0.75 * width {
            continue;
        }
        let n = two
            .iter()
            .filter(|m| m.segs[0].x1 < g && m.segs[1].x0 > g)
            .count();
        if best.is_none_or(|(bn, _)| n > bn) {
            best = Some((n, g));
        }
    }
    let (n, g) = best?;
    if n < 3 || n * 2 < two.len() {
        return None;
    }
    let crossing = lines
        .iter()
        .filter(|l| l.segs.iter().any(|s| s.x0 < g && s.x1 > g))
        .count();
    if crossing * 4 > lines.len() {
        return None;
    }
    // Prose, not a two-column table: the median segment fills most of its column.
    let mut fill_l: Vec<f32> = two
        .iter()
        .map(|l| (l.segs[0].x1 - l.segs[0].x0) / (g - left))
        .collect();
    let mut fill_r: Vec<f32> = two
        .iter()
        .map(|l| (l.segs[1].x1 - l.segs[1].x0) / (right - g))
        .collect();
    fill_l.sort_by(f32::total_cmp);
    fill_r.sort_by(f32::total_cmp);
    let med = |v: &[f32]| v[v.len() / 2];
    (med(&fill_l) > 0.6 && med(&fill_r) > 0.6).then_some(g)
}

/// The font size that carries the most text.
fn body_size(pages: &[(Vec<Line>, f32)]) -> f32 {
    let mut by: HashMap<i32, usize> = HashMap::new();
    for (lines, _) in pages {
        for l in lines {
            *by.entry((l.size * 2.0).round() as i32).or_default() +=
                l.segs.iter().map(|s| s.text.len()).sum::<usize>();
        }
    }
    by.into_iter()
        .max_by_key(|&(s, n)| (n, -s))
        .map_or(10.0, |(s, _)| s as f32 / 2.0)
}

/// Heading sizes, largest first (at most 5 levels).
fn heading_sizes(pages: &[(Vec<Line>, f32)], body: f32) -> Vec<i32> {
    let mut sizes: Vec<i32> = pages
        .iter()
        .flat_map(|(l, _)| l.iter())
        .filter(|l| l.segs.len() == 1 && l.size >= body * 1.15 && l.segs[0].text.len() <= 150)
        .map(|l| (l.size * 2.0).round() as i32)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    sizes.truncate(5);
    sizes
}

fn is_list_start(t: &str) -> bool {
    let t = t.trim_start();
    t.starts_with("- ") || t.starts_with("• ") || t.starts_with("– ") || t.starts_with("* ") || {
        let n = t.bytes().take_while(u8::is_ascii_digit).count();
        (1..=3).contains(&n) && (t[n..].starts_with(". ") || t[n..].starts_with(") "))
    }
}

/// Joins a wrapped line onto a paragraph: a hyphen at the end of a line followed by a lowercase
/// start is a word broken across lines.
fn join_line(para: &mut String, next: &str) {
    if para.is_empty() {
        para.push_str(next);
        return;
    }
    let hyphenated = para.ends_with('-')
        && para[..para.len() - 1]
            .chars()
            .last()
            .is_some_and(char::is_alphabetic)
        && next.chars().next().is_some_and(char::is_lowercase);
    if hyphenated {
        para.pop();
    } else {
        para.push(' ');
    }
    para.push_str(next);
}

fn layout_blocks(
    lines: Vec<Line>,
    page: u32,
    body: f32,
    heading_sizes: &[i32],
    sections: &mut Vec<(u8, String)>,
    budget: &mut Budget,
    out: &mut Vec<Block>,
) -> Result<(), Refusal> {
    let mut lay = PageLayout {
        page,
        sections,
        budget,
        out,
        para: String::new(),
        para_kind: BlockKind::Paragraph,
    };
    let mut prev: Option<&Line> = None;
    let mut i = 0;
    while i < lines.len() {
        let l = &lines[i];
        // A table: consecutive lines of two or more cells.
        if l.segs.len() >= 2
            && lines
                .get(i + 1)
                .is_some_and(|n| n.segs.len() >= 2 && n.column == l.column)
        {
            i = lay.table(&lines, i)?;
            prev = None;
            continue;
        }
        let text = l.text();
        let size_key = (l.size * 2.0).round() as i32;
        if let Some(rank) = heading_sizes.iter().position(|&s| s == size_key)
            && l.segs.len() == 1
        {
            i = lay.sized_heading(&lines, i, rank, text)?;
            prev = None;
            continue;
        }
        if is_bold_heading(l, prev, lines.get(i + 1), &text, body) && heading_sizes.is_empty() {
            lay.flush()?;
            lay.heading(6, text)?;
            prev = None;
            i += 1;
            continue;
        }
        let continues = prev.is_some_and(|p| {
            p.column == l.column
                && p.y > l.y
                && p.y - l.y <= 1.7 * p.size.max(l.size)
                && (p.size - l.size).abs() <= 0.15 * p.size
                && p.bold == l.bold
        });
        if !continues || is_list_start(&text) {
            lay.flush()?;
            if is_list_start(&text) {
                lay.para_kind = BlockKind::ListItem;
            }
        }
        join_line(&mut lay.para, &text);
        prev = Some(l);
        i += 1;
    }
    lay.flush()
}

/// A bold line at about body size, short, not ending a sentence, after no bold line of its
/// column and before a plain one: a heading when the file has no larger heading sizes.
fn is_bold_heading(
    l: &Line,
    prev: Option<&Line>,
    next: Option<&Line>,
    text: &str,
    body: f32,
) -> bool {
    let bold_heading = l.bold
        && l.size >= body * 0.95
        && text.len() <= 80
        && !text.ends_with('.')
        && prev.is_none_or(|p| !p.bold || p.column != l.column);
    let next_plain = next.is_some_and(|n| !n.bold);
    bold_heading && next_plain
}

/// One page's blocks being laid out: the paragraph being joined and the heading stack (which
/// goes on to the next page).
struct PageLayout<'p> {
    page: u32,
    sections: &'p mut Vec<(u8, String)>,
    budget: &'p mut Budget,
    out: &'p mut Vec<Block>,
    para: String,
    para_kind: BlockKind,
}

impl PageLayout<'_> {
    fn anchor(&self) -> Anchor {
        Anchor {
            page: Some(self.page),
            section: self.sections.iter().map(|(_, t)| t.clone()).collect(),
            ..Anchor::default()
        }
    }

    fn push(&mut self, kind: BlockKind, text: String) -> Result<(), Refusal> {
        let anchor = self.anchor();
        self.budget.push(self.out, Block { kind, text, anchor })
    }

    /// The paragraph being joined, if any, becomes a block; the next starts as a paragraph.
    fn flush(&mut self) -> Result<(), Refusal> {
        if !self.para.is_empty() {
            let text = std::mem::take(&mut self.para);
            self.push(self.para_kind, text)?;
        }
        self.para_kind = BlockKind::Paragraph;
        Ok(())
    }

    /// A heading of `level`: the section stack cut to above it, then it entered.
    fn heading(&mut self, level: u8, title: String) -> Result<(), Refusal> {
        while self.sections.last().is_some_and(|(lv, _)| *lv >= level) {
            self.sections.pop();
        }
        self.sections.push((level, title.clone()));
        self.push(BlockKind::Heading(self.sections.len().min(6) as u8), title)
    }

    /// The table starting at line `i` (its rows the lines of two or more cells in the same
    /// column); returns the index of the line after it.
    fn table(&mut self, lines: &[Line], mut i: usize) -> Result<usize, Refusal> {
        let column = lines[i].column;
        self.flush()?;
        let mut rows = Vec::new();
        while i < lines.len() && lines[i].segs.len() >= 2 && lines[i].column == column {
            rows.push(lines[i].text().replace('\n', " "));
            i += 1;
        }
        self.push(BlockKind::Table { header_rows: 1 }, rows.join("\n"))?;
        Ok(i)
    }

    /// A heading by font size (`rank` among the heading sizes) starting at line `i`:
    /// consecutive lines of one heading size are one (wrapped) heading. Returns the index of
    /// the line after it.
    fn sized_heading(
        &mut self,
        lines: &[Line],
        mut i: usize,
        rank: usize,
        text: String,
    ) -> Result<usize, Refusal> {
        let l = &lines[i];
        let size_key = (l.size * 2.0).round() as i32;
        let mut title = text;
        while let Some(n) = lines.get(i + 1)
            && n.segs.len() == 1
            && (n.size * 2.0).round() as i32 == size_key
            && (l.y - n.y).abs() < 2.0 * l.size
            && n.column == l.column
        {
            join_line(&mut title, &n.text());
            i += 1;
        }
        self.flush()?;
        self.heading((rank + 1) as u8, title)?;
        Ok(i + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-page PDF (uncompressed streams) whose page draws form `/X` `draws` times; the
    /// form shows "Logo".
    fn form_pdf(draws: usize) -> Vec<u8> {
        let content = "/X Do\n".repeat(draws);
        let form = "BT /F1 9 Tf 20 20 Td (Logo) Tj ET";
        let objects = [
            "<< /Type /Catalog /Pages 2 0 R >>".to_owned(),
            "<< /Type /Pages /Kids [3 0 R] /Count 1 >>".to_owned(),
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> /XObject << /X 6 0 R >> >> /Contents 5 0 R >>".to_owned(),
            "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_owned(),
            format!("<< /Length {} >>\nstream\n{content}\nendstream", content.len()),
            format!(
                "<< /Type /XObject /Subtype /Form /BBox [0 0 612 792] /Length {} >>\nstream\n{form}\nendstream",
                form.len()
            ),
        ];
        let mut out = String::from("%PDF-1.4\n");
        let mut offsets = Vec::new();
        for (i, o) in objects.iter().enumerate() {
            offsets.push(out.len());
            out += &format!("{} 0 obj\n{o}\nendobj\n", i + 1);
        }
        let xref = out.len();
        out += "xref\n0 7\n0000000000 65535 f \n";
        for off in offsets {
            out += &format!("{off:010} 00000 n \n");
        }
        out += &format!("trailer\n<< /Size 7 /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n");
        out.into_bytes()
    }

    #[test]
    fn a_form_drawn_again_is_inflated_once() {
        let doc = Document::load_mem(&form_pdf(50)).unwrap();
        let limits = Limits::default();
        let mut shared = Shared::default();
        let (_, page) = doc.get_pages().into_iter().next().unwrap();
        let mut interp = Interp::new(&doc, &limits, &mut shared);
        interp.page(page).unwrap();
        assert_eq!(interp.items.len(), 50, "the form is drawn 50 times");
        // The page's content and the form, once each.
        assert_eq!(shared.inflated, 2);
        assert_eq!(shared.content, (50 * 6 + 33 * 50) as u64);
    }

    #[test]
    fn oversized_operations_are_found_without_parsing_them() {
        let ok = b"BT /F1 12 Tf [(a) 1 (b) <00ff>] TJ ET q 1 0 0 1 0 0 cm Q";
        // The largest operation: `1 0 0 1 0 0 cm` (the `TJ` array counts 5: itself and 4).
        check_operands(ok, 6).unwrap();
        assert_eq!(
            check_operands(ok, 5).unwrap_err().to_string(),
            "limit exceeded: max_pdf_operands (6 > 5)"
        );
        // Strings, comments and inline image data hide nothing and count as they should.
        check_operands(
            b"(a [ [ [ ( ) \\) ] ) Tj % [ [ [ [\nBI /W 1 /H 1 ID [[[[[ EI Q",
            4,
        )
        .unwrap();
        // Every operator starts a new count.
        check_operands(&b"1 2 3 4 re ".repeat(1000), 4).unwrap();
        assert!(check_operands(&b"1 ".repeat(10), 9).is_err());
    }

    #[test]
    fn hyphenation_is_joined_only_for_broken_words() {
        let mut p = String::from("encrypted in a test enviro-");
        join_line(&mut p, "nment at least");
        assert_eq!(p, "encrypted in a test environment at least");
        let mut p = String::from("Rates are set per year -");
        join_line(&mut p, "see below");
        assert_eq!(p, "Rates are set per year - see below");
        let mut p = String::from("the self-");
        join_line(&mut p, "Assessment");
        assert_eq!(p, "the self- Assessment");
    }

    #[test]
    fn matrices_compose_in_pdf_order() {
        let scale = M([2.0, 0.0, 0.0, 2.0, 0.0, 0.0]);
        let shift = M::translate(10.0, 5.0);
        assert_eq!(shift.then(scale).apply(0.0, 0.0), (20.0, 10.0));
        assert_eq!(scale.then(shift).apply(1.0, 1.0), (12.0, 7.0));
    }
}
