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
}
