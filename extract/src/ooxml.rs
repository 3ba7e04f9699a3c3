//! DOCX (headings → section path, lists, tables as rows) and PPTX (one section per slide:
//! title, body, tables, notes), read with the guards of [`crate::xml`].

use std::collections::HashMap;

use crate::limits::Budget;
use crate::xml::{Ev, Zip, attr, core_title, tag};
use crate::{Anchor, Block, BlockKind, Extracted, Format, Limits, Refusal};

/// A heading stack: levels and titles, for the section path.
#[derive(Default)]
struct Sections {
    levels: Vec<(u8, String)>,
}

impl Sections {
    fn enter(&mut self, level: u8, title: &str) -> u8 {
        while self.levels.last().is_some_and(|(l, _)| *l >= level) {
            self.levels.pop();
        }
        self.levels.push((level, title.to_owned()));
        self.levels.len().min(6) as u8
    }

    fn path(&self) -> Vec<String> {
        self.levels.iter().map(|(_, t)| t.clone()).collect()
    }
}

// --- DOCX ------------------------------------------------------------------------------------

#[derive(Default, Clone)]
struct Style {
    name: String,
    outline: Option<u8>,
    num: bool,
}

fn docx_styles(zip: &mut Zip<'_>, limits: &Limits) -> Result<HashMap<String, Style>, Refusal> {
    let mut out = HashMap::new();
    let mut cur: Option<(String, Style)> = None;
    zip.walk_xml("word/styles.xml", limits, |ev| {
        match ev {
            Ev::Start(s) | Ev::Empty(s) => match tag(s) {
                b"style" => cur = attr(s, b"styleId").map(|id| (id, Style::default())),
                b"name" => {
                    if let Some((_, st)) = cur.as_mut() {
                        st.name = attr(s, b"val").unwrap_or_default();
                    }
                }
                b"outlineLvl" => {
                    if let Some((_, st)) = cur.as_mut() {
                        st.outline = attr(s, b"val").and_then(|v| v.parse().ok());
                    }
                }
                b"numPr" => {
                    if let Some((_, st)) = cur.as_mut() {
                        st.num = true;
                    }
                }
                _ => {}
            },
            Ev::End(n) if n == b"style" => {
                if let Some((id, st)) = cur.take() {
                    out.insert(id, st);
                }
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(out)
}

/// numId → whether level 0 is a bullet.
fn docx_numbering(zip: &mut Zip<'_>, limits: &Limits) -> Result<HashMap<String, bool>, Refusal> {
    let mut out = HashMap::new();
    let mut abstract_bullet: HashMap<String, bool> = HashMap::new();
    let mut num_abstract: Vec<(String, String)> = Vec::new();
    let mut cur_abstract: Option<String> = None;
    let mut cur_lvl0 = false;
    let mut cur_num: Option<String> = None;
    zip.walk_xml("word/numbering.xml", limits, |ev| {
        match ev {
            Ev::Start(s) | Ev::Empty(s) => match tag(s) {
                b"abstractNum" => cur_abstract = attr(s, b"abstractNumId"),
                b"lvl" => cur_lvl0 = attr(s, b"ilvl").as_deref() == Some("0"),
                b"numFmt" if cur_lvl0 => {
                    if let Some(a) = &cur_abstract {
                        abstract_bullet
                            .insert(a.clone(), attr(s, b"val").as_deref() == Some("bullet"));
                    }
                }
                b"num" => cur_num = attr(s, b"numId"),
                b"abstractNumId" => {
                    if let (Some(n), Some(a)) = (&cur_num, attr(s, b"val")) {
                        num_abstract.push((n.clone(), a));
                    }
                }
                _ => {}
            },
            Ev::End(b"abstractNum") => cur_abstract = None,
            Ev::End(b"lvl") => cur_lvl0 = false,
            _ => {}
        }
        Ok(())
    })?;
    for (n, a) in num_abstract {
        out.insert(n, abstract_bullet.get(&a).copied().unwrap_or(true));
    }
    Ok(out)
}

#[derive(Default)]
struct TableBuild {
    rows: Vec<Vec<String>>,
    row: Option<Vec<String>>,
    cell: Option<String>,
}

pub(crate) fn extract_docx(
    bytes: &[u8],
    limits: &Limits,
    budget: &mut Budget,
) -> Result<Extracted, Refusal> {
    let mut zip = Zip::open(bytes, Format::Docx, limits)?;
    let title = core_title(&mut zip, limits)?;
    let styles = docx_styles(&mut zip, limits)?;
    let numbering = docx_numbering(&mut zip, limits)?;
    let mut out = Extracted {
        title,
        ..Extracted::default()
    };
    let mut body = DocxBody::new(&styles, &numbering);
    let mut result: Result<(), Refusal> = Ok(());
    let found = zip.walk_xml("word/document.xml", limits, |ev| {
        let r = body.event(ev, budget, &mut out.blocks);
        if let Err(e) = &r {
            result = Err(e.clone());
        }
        r
    })?;
    result?;
    if !found {
        return Err(Refusal::malformed(Format::Docx, "no word/document.xml"));
    }
    if out.title.is_none() {
        out.title = out.blocks.iter().find_map(|b| match b.kind {
            BlockKind::Heading(_) => Some(b.text.clone()),
            _ => None,
        });
    }
    out.units = 1;
    Ok(out)
}

/// The paragraph being read: its text and the properties that make it a heading or a list item.
#[derive(Default)]
struct DocxPara {
    text: String,
    style: Option<String>,
    num: Option<String>,
    outline: Option<u8>,
}

/// The walk over `word/document.xml`: the heading stack, list counters, open tables and the
/// paragraph being read.
struct DocxBody<'s> {
    styles: &'s HashMap<String, Style>,
    numbering: &'s HashMap<String, bool>,
    sections: Sections,
    counters: HashMap<String, u32>,
    tables: Vec<TableBuild>,
    para: DocxPara,
    in_t: bool,
    /// Inside mc:Fallback (a duplicate of mc:Choice), w:delText or w:instrText: text skipped.
    skip: u32,
}

impl<'s> DocxBody<'s> {
    fn new(styles: &'s HashMap<String, Style>, numbering: &'s HashMap<String, bool>) -> Self {
        DocxBody {
            styles,
            numbering,
            sections: Sections::default(),
            counters: HashMap::new(),
            tables: Vec::new(),
            para: DocxPara::default(),
            in_t: false,
            skip: 0,
        }
    }

    fn event(
        &mut self,
        ev: Ev<'_, '_>,
        budget: &mut Budget,
        blocks: &mut Vec<Block>,
    ) -> Result<(), Refusal> {
        match ev {
            Ev::Start(s) => self.start(tag(s)),
            Ev::Empty(s) if self.skip == 0 => match tag(s) {
                b"pStyle" => self.para.style = attr(s, b"val"),
                b"numId" => self.para.num = attr(s, b"val"),
                b"outlineLvl" => self.para.outline = attr(s, b"val").and_then(|v| v.parse().ok()),
                b"tab" | b"br" | b"cr" => self.para.text.push(' '),
                _ => {}
            },
            Ev::Text(t) if self.in_t && self.skip == 0 => self.para.text.push_str(t),
            Ev::End(n) => return self.end(n, budget, blocks),
            _ => {}
        }
        Ok(())
    }

    fn start(&mut self, name: &[u8]) {
        match name {
            b"Fallback" | b"delText" | b"instrText" => self.skip += 1,
            _ if self.skip > 0 => {}
            b"t" => self.in_t = true,
            b"tbl" => self.tables.push(TableBuild::default()),
            b"tr" => {
                if let Some(t) = self.tables.last_mut() {
                    t.row = Some(Vec::new());
                }
            }
            b"tc" => {
                if let Some(t) = self.tables.last_mut() {
                    t.cell = Some(String::new());
                }
            }
            b"p" => self.para = DocxPara::default(),
            _ => {}
        }
    }

    fn end(
        &mut self,
        name: &[u8],
        budget: &mut Budget,
        blocks: &mut Vec<Block>,
    ) -> Result<(), Refusal> {
        match name {
            b"Fallback" | b"delText" | b"instrText" => self.skip = self.skip.saturating_sub(1),
            _ if self.skip > 0 => {}
            b"t" => self.in_t = false,
            b"p" => return self.end_paragraph(budget, blocks),
            b"tc" => {
                if let Some(t) = self.tables.last_mut() {
                    let cell = t.cell.take().unwrap_or_default();
                    if let Some(row) = t.row.as_mut() {
                        row.push(cell.replace(" | ", " / "));
                    }
                }
            }
            b"tr" => {
                if let Some(t) = self.tables.last_mut()
                    && let Some(row) = t.row.take()
                    && row.iter().any(|c| !c.is_empty())
                {
                    t.rows.push(row);
                }
            }
            b"tbl" => return self.end_table(budget, blocks),
            _ => {}
        }
        Ok(())
    }

    /// A paragraph ends: into the open table cell, or a heading, list item or paragraph block.
    fn end_paragraph(
        &mut self,
        budget: &mut Budget,
        blocks: &mut Vec<Block>,
    ) -> Result<(), Refusal> {
        let text = self
            .para
            .text
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(t) = self.tables.last_mut() {
            if let Some(cell) = t.cell.as_mut() {
                if !cell.is_empty() && !text.is_empty() {
                    cell.push(' ');
                }
                cell.push_str(&text);
            }
            return Ok(());
        }
        if text.is_empty() {
            return Ok(());
        }
        let block = self.paragraph_block(text);
        budget.push(blocks, block)
    }

    /// The block of a non-empty paragraph outside tables: a heading (entering its section), a
    /// list item (numbered ones counted per list) or a paragraph (which resets the counters).
    fn paragraph_block(&mut self, text: String) -> Block {
        let styles = self.styles;
        let style = self
            .para
            .style
            .as_ref()
            .and_then(|id| styles.get(id).cloned().map(|s| (id, s)));
        let level = self
            .para
            .outline
            .or_else(|| style.as_ref().and_then(|(id, s)| heading_level(id, s)));
        if let Some(level) = level {
            let depth = self.sections.enter(level, &text);
            return Block {
                kind: BlockKind::Heading(depth),
                text,
                anchor: self.anchor(),
            };
        }
        let style_name = style
            .as_ref()
            .map(|(_, s)| s.name.to_ascii_lowercase())
            .unwrap_or_default();
        let list = self.para.num.as_ref().filter(|n| *n != "0").map(|n| {
            (
                n.clone(),
                self.numbering
                    .get(n)
                    .copied()
                    .unwrap_or(!style_name.contains("number")),
            )
        });
        let list = list.or_else(|| {
            (style_name.contains("list") || style.as_ref().is_some_and(|(_, s)| s.num))
                .then(|| (style_name.clone(), !style_name.contains("number")))
        });
        match list {
            Some((key, bullet)) => {
                let prefix = if bullet {
                    "- ".to_owned()
                } else {
                    let c = self.counters.entry(key).or_insert(0);
                    *c += 1;
                    format!("{c}. ")
                };
                Block {
                    kind: BlockKind::ListItem,
                    text: prefix + &text,
                    anchor: self.anchor(),
                }
            }
            None => {
                self.counters.clear();
                Block {
                    kind: BlockKind::Paragraph,
                    text,
                    anchor: self.anchor(),
                }
            }
        }
    }

    /// A table ends: its rows become the enclosing cell's text, or a table block.
    fn end_table(&mut self, budget: &mut Budget, blocks: &mut Vec<Block>) -> Result<(), Refusal> {
        let t = self.tables.pop().unwrap_or_default();
        let lines: Vec<String> = t.rows.iter().map(|r| r.join(" | ")).collect();
        if let Some(parent) = self.tables.last_mut() {
            // A table in a table cell: its rows become the cell's text.
            if let Some(cell) = parent.cell.as_mut() {
                cell.push_str(&lines.join("; "));
            }
            return Ok(());
        }
        if lines.is_empty() {
            return Ok(());
        }
        let header_rows = u32::from(lines.len() > 1);
        budget.push(
            blocks,
            Block {
                kind: BlockKind::Table { header_rows },
                text: lines.join("\n"),
                anchor: self.anchor(),
            },
        )
    }

    fn anchor(&self) -> Anchor {
        Anchor {
            section: self.sections.path(),
            ..Anchor::default()
        }
    }
}

/// The heading level of a paragraph style: its outline level, or a "heading N" / "Title" name.
fn heading_level(id: &str, style: &Style) -> Option<u8> {
    if let Some(o) = style.outline
        && o < 9
    {
        return Some(o + 1);
    }
    let name = if style.name.is_empty() {
        id
    } else {
        &style.name
    }
    .to_ascii_lowercase();
    if name == "title" {
        return Some(1);
    }
    let rest = name.strip_prefix("heading")?.trim();
    rest.parse::<u8>().ok().filter(|l| (1..=9).contains(l))
}

// --- PPTX ------------------------------------------------------------------------------------

/// Relationship id → target (resolved against `base_dir`).
fn rels(
    zip: &mut Zip<'_>,
    path: &str,
    base_dir: &str,
    limits: &Limits,
) -> Result<Vec<(String, String, String)>, Refusal> {
    let mut out = Vec::new();
    zip.walk_xml(path, limits, |ev| {
        if let Ev::Empty(s) | Ev::Start(s) = ev
            && tag(s) == b"Relationship"
            && let (Some(id), Some(target)) = (attr(s, b"Id"), attr(s, b"Target"))
        {
            let ty = attr(s, b"Type").unwrap_or_default();
            out.push((id, resolve(base_dir, &target), ty));
        }
        Ok(())
    })?;
    Ok(out)
}

/// `ppt/slides` + `../notesSlides/n.xml` → `ppt/notesSlides/n.xml`.
fn resolve(base_dir: &str, target: &str) -> String {
    if let Some(abs) = target.strip_prefix('/') {
        return abs.to_owned();
    }
    let mut parts: Vec<&str> = base_dir.split('/').filter(|p| !p.is_empty()).collect();
    for seg in target.split('/') {
        match seg {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            s => parts.push(s),
        }
    }
    parts.join("/")
}

/// The text of one slide or notes part: (title, body paragraphs, tables).
#[derive(Default)]
struct SlideText {
    title: String,
    body: Vec<String>,
    tables: Vec<Vec<String>>,
}

/// The text of slide (or notes) part `path`; `None` when the part is missing.
fn slide_text(
    zip: &mut Zip<'_>,
    path: &str,
    limits: &Limits,
    notes: bool,
) -> Result<Option<SlideText>, Refusal> {
    let mut out = SlideText::default();
    let mut ph: Option<String> = None;
    let mut in_sp = false;
    let mut para = String::new();
    let mut in_t = false;
    let mut table: Option<TableBuild> = None;
    let mut skip: u32 = 0;
    let found = zip.walk_xml(path, limits, |ev| {
        match ev {
            Ev::Start(s) => match tag(s) {
                b"Fallback" => skip += 1,
                _ if skip > 0 => {}
                b"sp" => {
                    in_sp = true;
                    ph = None;
                }
                b"ph" => ph = Some(attr(s, b"type").unwrap_or_else(|| "body".into())),
                b"t" => in_t = true,
                b"p" => para.clear(),
                b"tbl" => table = Some(TableBuild::default()),
                b"tr" => {
                    if let Some(t) = table.as_mut() {
                        t.row = Some(Vec::new());
                    }
                }
                b"tc" => {
                    if let Some(t) = table.as_mut() {
                        t.cell = Some(String::new());
                    }
                }
                _ => {}
            },
            Ev::Empty(s) if skip == 0 => match tag(s) {
                b"ph" => ph = Some(attr(s, b"type").unwrap_or_else(|| "body".into())),
                b"br" => para.push(' '),
                _ => {}
            },
            Ev::Text(t) if in_t && skip == 0 => para.push_str(t),
            Ev::End(n) => match n {
                b"Fallback" => skip = skip.saturating_sub(1),
                _ if skip > 0 => {}
                b"t" => in_t = false,
                b"sp" => in_sp = false,
                b"p" => {
                    let text = para.split_whitespace().collect::<Vec<_>>().join(" ");
                    para.clear();
                    if text.is_empty() {
                        return Ok(());
                    }
                    if let Some(t) = table.as_mut() {
                        if let Some(c) = t.cell.as_mut() {
                            if !c.is_empty() {
                                c.push(' ');
                            }
                            c.push_str(&text);
                        }
                        return Ok(());
                    }
                    let kind = ph.as_deref().unwrap_or("");
                    if notes {
                        // Notes pages repeat the slide image and number; only the body is notes.
                        if in_sp && kind == "body" {
                            out.body.push(text);
                        }
                    } else if in_sp && matches!(kind, "title" | "ctrTitle") {
                        if !out.title.is_empty() {
                            out.title.push(' ');
                        }
                        out.title.push_str(&text);
                    } else if !matches!(kind, "sldNum" | "dt" | "ftr") {
                        out.body.push(text);
                    }
                }
                b"tc" => {
                    if let Some(t) = table.as_mut() {
                        let c = t.cell.take().unwrap_or_default();
                        if let Some(r) = t.row.as_mut() {
                            r.push(c.replace(" | ", " / "));
                        }
                    }
                }
                b"tr" => {
                    if let Some(t) = table.as_mut()
                        && let Some(r) = t.row.take()
                    {
                        t.rows.push(r);
                    }
                }
                b"tbl" => {
                    if let Some(t) = table.take() {
                        out.tables
                            .push(t.rows.iter().map(|r| r.join(" | ")).collect());
                    }
                }
                _ => {}
            },
            _ => {}
        }
        Ok(())
    })?;
    Ok(found.then_some(out))
}

pub(crate) fn extract_pptx(
    bytes: &[u8],
    limits: &Limits,
    budget: &mut Budget,
) -> Result<Extracted, Refusal> {
    let mut zip = Zip::open(bytes, Format::Pptx, limits)?;
    let title = core_title(&mut zip, limits)?;
    let mut ids = Vec::new();
    let found = zip.walk_xml("ppt/presentation.xml", limits, |ev| {
        if let Ev::Empty(s) | Ev::Start(s) = ev
            && tag(s) == b"sldId"
            && let Some(id) = attr(s, b"r:id")
        {
            ids.push(id);
        }
        Ok(())
    })?;
    if !found {
        return Err(Refusal::malformed(Format::Pptx, "no ppt/presentation.xml"));
    }
    if ids.len() as u64 > u64::from(limits.max_slides) {
        return Err(Refusal::limit("max_slides", ids.len(), limits.max_slides));
    }
    let pres_rels = rels(&mut zip, "ppt/_rels/presentation.xml.rels", "ppt", limits)?;
    let mut out = Extracted {
        title,
        ..Extracted::default()
    };
    for (i, id) in ids.iter().enumerate() {
        let n = (i + 1) as u32;
        let Some((_, path, _)) = pres_rels.iter().find(|(rid, _, _)| rid == id) else {
            continue;
        };
        let path = path.clone();
        let Some(slide) = slide_text(&mut zip, &path, limits, false)? else {
            continue;
        };
        let (dir, file) = path.rsplit_once('/').unwrap_or(("", &path));
        let slide_rels = rels(&mut zip, &format!("{dir}/_rels/{file}.rels"), dir, limits)?;
        let notes = match slide_rels
            .iter()
            .find(|(_, _, ty)| ty.ends_with("/notesSlide"))
        {
            Some((_, notes_path, _)) => slide_text(&mut zip, &notes_path.clone(), limits, true)?
                .map(|s| s.body)
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let heading = if slide.title.is_empty() {
            format!("Slide {n}")
        } else {
            slide.title.clone()
        };
        let anchor = Anchor {
            slide: Some(n),
            section: vec![heading.clone()],
            ..Anchor::default()
        };
        budget.push(
            &mut out.blocks,
            Block {
                kind: BlockKind::Heading(1),
                text: heading.clone(),
                anchor: anchor.clone(),
            },
        )?;
        for b in slide.body {
            budget.push(
                &mut out.blocks,
                Block {
                    kind: BlockKind::Paragraph,
                    text: b,
                    anchor: anchor.clone(),
                },
            )?;
        }
        for t in slide.tables {
            let header_rows = u32::from(t.len() > 1);
            budget.push(
                &mut out.blocks,
                Block {
                    kind: BlockKind::Table { header_rows },
                    text: t.join("\n"),
                    anchor: anchor.clone(),
                },
            )?;
        }
        if !notes.is_empty() {
            let mut a = anchor.clone();
            a.section.push("Notes".into());
            budget.push(
                &mut out.blocks,
                Block {
                    kind: BlockKind::Paragraph,
                    text: format!("Notes: {}", notes.join(" ")),
                    anchor: a,
                },
            )?;
        }
        out.units = n;
    }
    if out.title.is_none() {
        out.title = out.blocks.first().map(|b| b.text.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::resolve;

    #[test]
    fn relationship_targets_resolve() {
        assert_eq!(
            resolve("ppt/slides", "../notesSlides/notesSlide1.xml"),
            "ppt/notesSlides/notesSlide1.xml"
        );
        assert_eq!(resolve("ppt", "slides/slide1.xml"), "ppt/slides/slide1.xml");
        assert_eq!(
            resolve("ppt", "/ppt/slides/slide2.xml"),
            "ppt/slides/slide2.xml"
        );
    }
}
