//! Structure-aware chunking on the embedder's own tokens.
//!
//! The text is tokenized once (`Embed::token_spans`); every token boundary gets a priority from
//! the structure around it (heading > paragraph > line > sentence > word). A chunk takes up to
//! `max_tokens` tokens and ends at the latest boundary of the highest priority inside its window,
//! so sections are kept whole when they fit, then paragraphs, then sentences. Consecutive chunks
//! of one section overlap by about `overlap` of a chunk, starting on a sentence when one is near
//! (within twice the overlap);
//! a chunk that starts at a heading gets no overlap (the new section does not need the old one's
//! tail). Splitter crates re-tokenize each candidate piece (quadratic calls into the tokenizer),
//! which is why this is done here on one token pass.

/// Priority of a cut before a token; higher wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cut {
    Word = 1,
    Sentence = 2,
    Line = 3,
    Paragraph = 4,
    Heading = 5,
}

/// One chunk of a document: byte range of its text and range of its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSpan {
    /// Byte offset of the first character.
    pub byte_start: usize,
    /// Byte offset one past the last character.
    pub byte_end: usize,
    /// Index of the first token.
    pub token_start: usize,
    /// Index one past the last token.
    pub token_end: usize,
}

/// Splits `text`, tokenized as `spans` (byte ranges, in order), into chunks of at most
/// `max_tokens` tokens with about `overlap` (fraction) overlap.
pub fn chunk(
    text: &str,
    spans: &[(usize, usize)],
    max_tokens: usize,
    overlap: f32,
) -> Vec<ChunkSpan> {
    let n = spans.len();
    if n == 0 {
        return Vec::new();
    }
    let max_tokens = max_tokens.max(1);
    let prio = cut_priorities(text, spans);
    let overlap_tokens = ((max_tokens as f32) * overlap).round() as usize;
    let mut out = Vec::new();
    let mut s = 0;
    while s < n {
        if n - s <= max_tokens {
            out.push(span(spans, s, n));
            break;
        }
        let hi = s + max_tokens;
        let mut best: Option<(Cut, usize)> = None;
        for c in (s + 1..=hi).rev() {
            let p = prio[c];
            let lower = if p == Cut::Heading {
                s + max_tokens / 4
            } else {
                s + max_tokens / 2
            };
            if c < lower.max(s + 1) {
                continue;
            }
            if best.is_none_or(|(bp, _)| p > bp) {
                best = Some((p, c));
            }
        }
        let (p, c) = best.unwrap_or((Cut::Word, hi));
        out.push(span(spans, s, c));
        if p == Cut::Heading || overlap_tokens == 0 {
            s = c;
            continue;
        }
        // Start near `overlap_tokens` before the cut, on the closest sentence start within
        // twice that distance if there is one.
        let target = c.saturating_sub(overlap_tokens).max(s + 1);
        let from = c.saturating_sub(2 * overlap_tokens).max(s + 1);
        s = (from..c)
            .filter(|&t| prio[t] >= Cut::Sentence)
            .min_by_key(|&t| t.abs_diff(target))
            .unwrap_or(target);
    }
    out
}

fn span(spans: &[(usize, usize)], s: usize, e: usize) -> ChunkSpan {
    ChunkSpan {
        byte_start: spans[s].0,
        byte_end: spans[e - 1].1,
        token_start: s,
        token_end: e,
    }
}

/// `prio[t]` is the priority of cutting just before token `t` (`prio[n]` is the end).
fn cut_priorities(text: &str, spans: &[(usize, usize)]) -> Vec<Cut> {
    let n = spans.len();
    let mut prio = vec![Cut::Word; n + 1];
    let mut mark = |byte: usize, p: Cut| {
        let t = spans.partition_point(|&(start, _)| start < byte);
        if t <= n && prio[t] < p {
            prio[t] = p;
        }
    };
    // Line-level structure.
    let mut prev_blank = true;
    let mut prev_start: Option<usize> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim();
        if trimmed.is_empty() {
            prev_blank = true;
            continue;
        }
        if is_atx_heading(line) {
            mark(start, Cut::Heading);
        } else if is_setext_underline(trimmed) && !prev_blank {
            if let Some(p) = prev_start {
                mark(p, Cut::Heading);
            }
        } else if prev_blank {
            mark(start, Cut::Paragraph);
        } else {
            mark(start, Cut::Line);
        }
        prev_blank = false;
        prev_start = Some(start);
    }
    // Sentence ends: terminal punctuation (and closing quotes/brackets), then whitespace.
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if matches!(bytes[i], b'.' | b'!' | b'?') {
            let mut j = i + 1;
            while j < bytes.len() && matches!(bytes[j], b'"' | b'\'' | b')' | b']') {
                j += 1;
            }
            if j < bytes.len() && bytes[j].is_ascii_whitespace() {
                while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                    j += 1;
                }
                mark(j, Cut::Sentence);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    prio
}

fn is_atx_heading(line: &str) -> bool {
    let l = line.trim_start_matches(' ');
    if line.len() - l.len() > 3 {
        return false;
    }
    let hashes = l.bytes().take_while(|&b| b == b'#').count();
    (1..=6).contains(&hashes)
        && l[hashes..]
            .chars()
            .next()
            .is_none_or(|c| c == ' ' || c == '\t' || c == '\n' || c == '\r')
}

fn is_setext_underline(trimmed: &str) -> bool {
    trimmed.len() >= 3 && (trimmed.bytes().all(|b| b == b'=') || trimmed.bytes().all(|b| b == b'-'))
}

/// A chunk of an extracted document: its span, the header row put in front of its text when it
/// continues a split table, and its anchor.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionChunk {
    /// Byte and token range in the document text.
    pub span: ChunkSpan,
    /// Table header line to prepend (`header + "\n" + text`), for a piece of a split table
    /// that does not start with the header.
    pub header: Option<String>,
    /// Where the chunk starts in the original file.
    pub anchor: crate::ingest::Anchor,
}

/// Chunks a document made of [`crate::ingest::Region`]s: never across a page, slide, sheet or
/// attachment boundary; a table is its own piece, kept whole when it fits, else split between
/// rows with its header row repeated at the top of every piece; other text is chunked as
/// [`chunk`] does within each page (slide, sheet).
pub fn chunk_regions(
    text: &str,
    spans: &[(usize, usize)],
    regions: &[crate::ingest::Region],
    max_tokens: usize,
    overlap: f32,
    header_tokens: &dyn Fn(&str) -> usize,
) -> Vec<RegionChunk> {
    let max_tokens = max_tokens.max(1);
    let mut out = Vec::new();
    // Units: runs of regions with the same page/slide/sheet, a table alone.
    let mut i = 0;
    // Headings that lead the table after them (their first byte): see below.
    let mut lead: Option<usize> = None;
    while i < regions.len() {
        let r = &regions[i];
        let mut j = i + 1;
        // This unit is regions [i, end): shorter than [i, j) when its last headings lead the
        // table after it.
        let mut end = j;
        if r.table_header.is_none() {
            while j < regions.len()
                && regions[j].table_header.is_none()
                && same_place(&regions[j].anchor, &r.anchor)
            {
                j += 1;
            }
            end = j;
            // The headings right before a table in the same place (a sheet's name and the
            // caption above its table, a section heading over a table) are the table's
            // caption, not the end of the text before it nor a chunk of their own: a chunk of
            // bare headings says nothing and crowds out real sources, while the table's chunks
            // would lose what they are about.
            if j < regions.len()
                && regions[j].table_header.is_some()
                && same_place(&regions[j].anchor, &r.anchor)
            {
                while end > i
                    && only_headings(&text[regions[end - 1].byte_start..regions[end - 1].byte_end])
                {
                    end -= 1;
                }
            }
        }
        let ub = lead.take().unwrap_or(r.byte_start);
        let ue = if end > i {
            regions[end - 1].byte_end
        } else {
            ub
        };
        let t0 = spans.partition_point(|&(s, _)| s < ub);
        let t1 = spans.partition_point(|&(s, _)| s < ue);
        if t1 > t0 {
            let unit = &spans[t0..t1];
            if let Some(header) = &r.table_header {
                // The caption (if any) leads the first piece and is repeated, with the header
                // row, at the top of every later piece of a split table.
                let mut repeated: String = text[ub..r.byte_start]
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .flat_map(|l| [l.trim_end(), "\n"])
                    .collect();
                repeated.push_str(header);
                table_pieces(
                    text,
                    unit,
                    t0,
                    (ub, r),
                    &repeated,
                    header,
                    max_tokens,
                    header_tokens(&repeated),
                    &mut out,
                );
            } else {
                let local: Vec<(usize, usize)> =
                    unit.iter().map(|&(s, e)| (s - ub, e - ub)).collect();
                for c in chunk(&text[ub..ue], &local, max_tokens, overlap) {
                    let span = ChunkSpan {
                        byte_start: c.byte_start + ub,
                        byte_end: c.byte_end + ub,
                        token_start: c.token_start + t0,
                        token_end: c.token_end + t0,
                    };
                    // The anchor of the region the chunk starts in.
                    let k = regions[i..end]
                        .partition_point(|g| g.byte_end <= span.byte_start)
                        .min(end - i - 1);
                    out.push(RegionChunk {
                        span,
                        header: None,
                        anchor: regions[i + k].anchor.clone(),
                    });
                }
            }
        }
        lead = (end < j).then(|| regions[end].byte_start);
        i = j;
    }
    out
}

/// Whether every non-blank line of `text` is a Markdown ATX heading (how extracted headings
/// are written into a document's text).
fn only_headings(text: &str) -> bool {
    let mut any = false;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if !is_atx_heading(line) {
            return false;
        }
        any = true;
    }
    any
}

fn same_place(a: &crate::ingest::Anchor, b: &crate::ingest::Anchor) -> bool {
    a.page == b.page
        && a.slide == b.slide
        && a.sheet == b.sheet
        && a.section.first() == b.section.first()
}

/// Splits one table region between rows: every piece holds whole rows and, when it does not
/// start with the header row, gets `repeated` (the caption and the header row) prepended; its
/// row range is narrowed when the table's rows are numbered contiguously (spreadsheets, CSV).
/// `(lead, region)`: the unit starts at byte `lead`, the table's caption, if any, before the
/// region.
#[allow(clippy::too_many_arguments)]
fn table_pieces(
    text: &str,
    unit: &[(usize, usize)],
    t0: usize,
    (lead, region): (usize, &crate::ingest::Region),
    repeated: &str,
    header: &str,
    max_tokens: usize,
    header_tokens: usize,
    out: &mut Vec<RegionChunk>,
) {
    let (rb, re) = (region.byte_start, region.byte_end);
    if unit.len() <= max_tokens {
        out.push(RegionChunk {
            span: span(unit, 0, unit.len()).shift(t0),
            header: None,
            anchor: region.anchor.clone(),
        });
        return;
    }
    // Row starts (byte offsets of each line of the table) and the token each starts at; the
    // caption belongs to the first row.
    let mut rows: Vec<usize> = vec![lead];
    for (k, b) in text[rb..re].bytes().enumerate() {
        if b == b'\n' {
            rows.push(rb + k + 1);
        }
    }
    let header_lines = usize::from(text[rb..re].starts_with(header));
    let row_tok: Vec<usize> = rows
        .iter()
        .map(|&b| unit.partition_point(|&(s, _)| s < b))
        .collect();
    let budget = max_tokens.saturating_sub(header_tokens + 1).max(1);
    let first_data_row = header_lines;
    let numbered = region
        .anchor
        .rows
        .filter(|&(a, z)| (z - a + 1) as usize == rows.len() - header_lines);
    let mut r = 0;
    while r < rows.len() {
        // The first piece starts at the header itself; later pieces at a data row.
        let start_tok = row_tok[r];
        let limit = if r == 0 { max_tokens } else { budget };
        // Rows [r, e) start at token `start_tok` and end where row `e` starts.
        let end_of = |k: usize| {
            if k < rows.len() {
                row_tok[k]
            } else {
                unit.len()
            }
        };
        let mut e = r + 1;
        while e < rows.len() && end_of(e + 1) - start_tok <= limit {
            e += 1;
        }
        // A single row longer than the budget is cut by tokens.
        let end_tok = end_of(e).min(start_tok + limit);
        if end_tok <= start_tok {
            break;
        }
        let mut anchor = region.anchor.clone();
        if let Some((a, _)) = numbered {
            let first = (r.max(first_data_row) - first_data_row) as u32;
            let last = (e - 1).max(first_data_row) - first_data_row;
            anchor.rows = Some((a + first, a + last as u32));
        }
        out.push(RegionChunk {
            span: span(unit, start_tok, end_tok).shift(t0),
            header: (r > 0).then(|| repeated.to_owned()),
            anchor,
        });
        if end_tok >= unit.len() {
            break;
        }
        // Next piece: the first row not yet in a piece (the rest of a row longer than the
        // whole budget is dropped: such a row is not a table row a person reads).
        r = e.max(r + 1);
    }
}

impl ChunkSpan {
    fn shift(self, t0: usize) -> Self {
        Self {
            token_start: self.token_start + t0,
            token_end: self.token_end + t0,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whitespace tokenization, as byte spans.
    fn words(text: &str) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = None;
        for (i, c) in text.char_indices() {
            match (c.is_whitespace(), start) {
                (true, Some(s)) => {
                    out.push((s, i));
                    start = None;
                }
                (false, None) => start = Some(i),
                _ => {}
            }
        }
        if let Some(s) = start {
            out.push((s, text.len()));
        }
        out
    }

    fn texts<'a>(text: &'a str, chunks: &[ChunkSpan]) -> Vec<&'a str> {
        chunks
            .iter()
            .map(|c| &text[c.byte_start..c.byte_end])
            .collect()
    }

    #[test]
    fn short_text_is_one_chunk() {
        let t = "Just a few words here.";
        let c = chunk(t, &words(t), 50, 0.15);
        assert_eq!(texts(t, &c), vec![t]);
        assert!(chunk("", &[], 50, 0.15).is_empty());
    }

    #[test]
    fn cuts_on_headings_before_paragraphs_and_without_overlap() {
        let sec = |h: &str| format!("# {h}\n\nalpha beta gamma delta. epsilon zeta eta theta.\n\n");
        let t = format!("{}{}{}", sec("One"), sec("Two"), sec("Three"));
        // Each section is 10 tokens; a budget of 14 fits one section, not two.
        let c = chunk(&t, &words(&t), 14, 0.15);
        let got = texts(&t, &c);
        assert_eq!(got.len(), 3, "{got:?}");
        for (g, h) in got.iter().zip(["One", "Two", "Three"]) {
            assert!(g.starts_with(&format!("# {h}")), "{g}");
        }
    }

    #[test]
    fn long_paragraphs_split_on_sentences_with_overlap() {
        let sentence = "the quick brown fox jumps over the lazy dog.";
        let t = vec![sentence; 20].join(" ");
        let spans = words(&t);
        let c = chunk(&t, &spans, 40, 0.15);
        assert!(c.len() >= 5);
        for w in c.windows(2) {
            assert!(w[0].token_end - w[0].token_start <= 40);
            // Overlap present, at most twice the 15% target (sentence snap).
            assert!(w[1].token_start < w[0].token_end, "no overlap: {w:?}");
            assert!(
                w[0].token_end - w[1].token_start <= 12,
                "too much overlap: {w:?}"
            );
        }
        // Every chunk after the first starts on a sentence and every cut ends one.
        for g in texts(&t, &c) {
            assert!(g.starts_with("the quick"), "{g}");
            assert!(g.ends_with("dog."), "{g}");
        }
        // Full coverage: the first token of the text and the last are included.
        assert_eq!(c[0].token_start, 0);
        assert_eq!(c.last().unwrap().token_end, spans.len());
    }

    #[test]
    fn text_without_structure_still_respects_the_cap() {
        let t = vec!["word"; 1000].join(" ");
        let spans = words(&t);
        let c = chunk(&t, &spans, 100, 0.1);
        assert!(c.iter().all(|c| c.token_end - c.token_start <= 100));
        for w in c.windows(2) {
            assert!(w[1].token_start > w[0].token_start, "progress");
            assert!(w[1].token_start <= w[0].token_end, "coverage");
        }
        assert_eq!(c.last().unwrap().token_end, 1000);
    }

    #[test]
    fn setext_headings_are_recognised() {
        let t = "Intro\n=====\n\nsome text here\n\nNext\n----\n\nmore text";
        let spans = words(t);
        let prio = cut_priorities(t, &spans);
        let next = spans
            .iter()
            .position(|&(s, _)| &t[s..s + 4] == "Next")
            .unwrap();
        assert_eq!(prio[next], Cut::Heading);
        assert!(
            is_atx_heading("## x\n")
                && !is_atx_heading("#hashtag")
                && !is_atx_heading("    # code")
        );
    }

    #[test]
    fn split_tables_repeat_their_header_and_narrow_their_rows() {
        use crate::ingest::{Anchor, Region};
        let mut t = String::from("Intro text here.\n\nProduct | Rate");
        for i in 0..30 {
            t.push_str(&format!("\nrow{i} | {i}.5"));
        }
        let table_start = t.find("Product").unwrap();
        let regions = vec![
            Region {
                byte_start: 0,
                byte_end: 16,
                anchor: Anchor {
                    sheet: Some("S".into()),
                    ..Anchor::default()
                },
                table_header: None,
            },
            Region {
                byte_start: table_start,
                byte_end: t.len(),
                anchor: Anchor {
                    sheet: Some("S".into()),
                    rows: Some((2, 31)),
                    ..Anchor::default()
                },
                table_header: Some("Product | Rate".into()),
            },
        ];
        let spans = words(&t);
        let c = chunk_regions(&t, &spans, &regions, 20, 0.15, &|h: &str| words(h).len());
        assert_eq!(
            &t[c[0].span.byte_start..c[0].span.byte_end],
            "Intro text here."
        );
        let pieces = &c[1..];
        assert!(pieces.len() >= 4, "{pieces:?}");
        let mut next_row = 2;
        for (k, p) in pieces.iter().enumerate() {
            let body = &t[p.span.byte_start..p.span.byte_end];
            let text = match &p.header {
                Some(h) => format!("{h}\n{body}"),
                None => body.to_owned(),
            };
            assert!(text.starts_with("Product | Rate\nrow"), "piece {k}: {text}");
            assert!(
                words(&text).len() <= 20 + 1,
                "piece {k} over budget: {text}"
            );
            assert!(body.ends_with(".5"), "whole rows only: {body}");
            let (a, z) = p.anchor.rows.unwrap();
            assert_eq!(a, next_row, "contiguous row ranges");
            assert_eq!(
                (z - a + 1) as usize,
                text.lines().count() - 1,
                "range = its rows"
            );
            next_row = z + 1;
        }
        assert_eq!(next_row, 32, "every row once");
    }

    /// Regions of one sheet: text, the headings over a table (sheet name, caption), the table.
    fn captioned(rows: usize, intro: bool) -> (String, Vec<crate::ingest::Region>) {
        use crate::ingest::{Anchor, Region};
        let sheet = || Anchor {
            sheet: Some("Limits".into()),
            ..Anchor::default()
        };
        let mut t = String::new();
        let mut regions = Vec::new();
        let mut push = |t: &mut String, s: &str, header: Option<&str>| {
            if !t.is_empty() {
                t.push_str("\n\n");
            }
            let b = t.len();
            t.push_str(s);
            regions.push(Region {
                byte_start: b,
                byte_end: t.len(),
                anchor: sheet(),
                table_header: header.map(str::to_owned),
            });
        };
        if intro {
            push(&mut t, "Vault limits are set per branch.", None);
        }
        push(&mut t, "# Limits", None);
        push(&mut t, "## Bradwell Station Road branch limits", None);
        let mut table = String::from("Limit | Amount");
        for i in 0..rows {
            table.push_str(&format!("\nitem{i} | {i}00"));
        }
        push(&mut t, &table, Some("Limit | Amount"));
        (t, regions)
    }

    #[test]
    fn headings_over_a_table_are_its_caption_not_a_chunk() {
        let piece = |t: &str, c: &RegionChunk| -> String {
            let body = &t[c.span.byte_start..c.span.byte_end];
            match &c.header {
                Some(h) => format!("{h}\n{body}"),
                None => body.to_owned(),
            }
        };
        let heads_only = |s: &str| only_headings(s);
        // Headings alone before a small table: one chunk, the caption first.
        let (t, regions) = captioned(3, false);
        let spans = words(&t);
        let c = chunk_regions(&t, &spans, &regions, 50, 0.15, &|h: &str| words(h).len());
        assert_eq!(c.len(), 1, "{c:?}");
        let text = piece(&t, &c[0]);
        assert!(
            text.starts_with(
                "# Limits\n\n## Bradwell Station Road branch limits\n\nLimit | Amount\nitem0"
            ),
            "{text}"
        );
        // Text, then headings, then the table: the headings go with the table, not the text.
        let (t, regions) = captioned(3, true);
        let spans = words(&t);
        let c = chunk_regions(&t, &spans, &regions, 50, 0.15, &|h: &str| words(h).len());
        let texts: Vec<String> = c.iter().map(|c| piece(&t, c)).collect();
        assert_eq!(texts[0], "Vault limits are set per branch.", "{texts:?}");
        assert!(texts[1].starts_with("# Limits"), "{texts:?}");
        assert!(texts.iter().all(|x| !heads_only(x)), "{texts:?}");
        // A split table: every later piece repeats the caption and the header row, within the
        // budget, and every row is in exactly one piece.
        let (t, regions) = captioned(40, true);
        let spans = words(&t);
        let c = chunk_regions(&t, &spans, &regions, 30, 0.15, &|h: &str| words(h).len());
        let texts: Vec<String> = c.iter().map(|c| piece(&t, c)).collect();
        assert!(texts.len() >= 4, "{texts:?}");
        assert!(texts.iter().all(|x| !heads_only(x)), "{texts:?}");
        for x in &texts[2..] {
            assert!(
                x.starts_with(
                    "# Limits\n## Bradwell Station Road branch limits\nLimit | Amount\nitem"
                ),
                "{x}"
            );
            assert!(words(x).len() <= 30 + 1, "over budget: {x}");
        }
        let rows: usize = texts.iter().map(|x| x.matches("item").count()).sum();
        assert_eq!(rows, 40, "every row once");
        // Headings before a table on another sheet stay where they are.
        let (t, mut regions) = captioned(3, false);
        regions[2].anchor.sheet = Some("Other".into());
        let spans = words(&t);
        let c = chunk_regions(&t, &spans, &regions, 50, 0.15, &|h: &str| words(h).len());
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(piece(&t, &c[1]).starts_with("Limit | Amount"));
    }
}
