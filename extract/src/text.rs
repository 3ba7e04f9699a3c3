//! Plain text, Markdown and HTML: paragraphs, `#` headings (the section path) and pipe tables.

use crate::html::html_to_text;
use crate::limits::Budget;
use crate::{Anchor, Block, BlockKind, Extracted, Format, Limits, Refusal};

pub(crate) fn extract_markdown(
    bytes: &[u8],
    format: Format,
    budget: &mut Budget,
) -> Result<Extracted, Refusal> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        Refusal::malformed(format, format!("invalid UTF-8 at byte {}", e.valid_up_to()))
    })?;
    let mut out = Extracted::default();
    push_markdown(text, &Anchor::default(), budget, &mut out.blocks)?;
    out.title = out.blocks.iter().find_map(|b| match b.kind {
        BlockKind::Heading(_) => Some(b.text.clone()),
        _ => None,
    });
    Ok(out)
}

pub(crate) fn extract_html(
    bytes: &[u8],
    limits: &Limits,
    budget: &mut Budget,
) -> Result<Extracted, Refusal> {
    let text = html_to_text(bytes, limits)?;
    extract_markdown(text.as_bytes(), Format::Html, budget)
}

/// Appends the blocks of Markdown-ish `text` under `base` (its section path is the prefix of
/// every block's path).
pub(crate) fn push_markdown(
    text: &str,
    base: &Anchor,
    budget: &mut Budget,
    out: &mut Vec<Block>,
) -> Result<(), Refusal> {
    let mut section = base.section.clone();
    let depth0 = section.len();
    let mut levels: Vec<u8> = Vec::new();
    for para in split_paragraphs(text) {
        let lines: Vec<&str> = para.lines().collect();
        let mut anchor = base.clone();
        if let Some((level, title)) = heading(lines[0]) {
            while levels.last().is_some_and(|&l| l >= level) {
                levels.pop();
                section.pop();
            }
            levels.push(level);
            section.truncate(depth0 + levels.len() - 1);
            section.push(title.to_owned());
            anchor.section = section.clone();
            budget.push(
                out,
                Block {
                    kind: BlockKind::Heading(levels.len().min(6) as u8),
                    text: title.to_owned(),
                    anchor: anchor.clone(),
                },
            )?;
            if lines.len() > 1 {
                let rest = lines[1..].join("\n");
                push_body(&rest, &anchor, budget, out)?;
            }
            continue;
        }
        anchor.section = section.clone();
        push_body(para, &anchor, budget, out)?;
    }
    Ok(())
}

fn push_body(
    para: &str,
    anchor: &Anchor,
    budget: &mut Budget,
    out: &mut Vec<Block>,
) -> Result<(), Refusal> {
    let lines: Vec<&str> = para.lines().map(str::trim).collect();
    if lines.len() >= 2 && lines.iter().all(|l| l.starts_with('|')) {
        let rows: Vec<String> = lines
            .iter()
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(str::trim)
                    .collect::<Vec<_>>()
            })
            .filter(|cells| {
                !cells
                    .iter()
                    .all(|c| !c.is_empty() && c.trim_matches(':').chars().all(|ch| ch == '-'))
            })
            .map(|cells| cells.join(" | "))
            .collect();
        let rule = lines[1]
            .trim_matches('|')
            .split('|')
            .all(|c| c.trim().trim_matches(':').chars().all(|ch| ch == '-'));
        return budget.push(
            out,
            Block {
                kind: BlockKind::Table {
                    header_rows: u32::from(rule),
                },
                text: rows.join("\n"),
                anchor: anchor.clone(),
            },
        );
    }
    let list = lines.iter().all(|l| is_list_item(l));
    if list {
        for l in lines {
            budget.push(
                out,
                Block {
                    kind: BlockKind::ListItem,
                    text: l.to_owned(),
                    anchor: anchor.clone(),
                },
            )?;
        }
        return Ok(());
    }
    budget.push(
        out,
        Block {
            kind: BlockKind::Paragraph,
            text: para.trim().to_owned(),
            anchor: anchor.clone(),
        },
    )
}

fn is_list_item(l: &str) -> bool {
    l.starts_with("- ")
        || l.starts_with("* ")
        || l.starts_with("• ")
        || l.split_once(". ").is_some_and(|(n, _)| {
            !n.is_empty() && n.len() <= 3 && n.bytes().all(|b| b.is_ascii_digit())
        })
}

fn split_paragraphs(text: &str) -> impl Iterator<Item = &str> {
    text.split("\n\n")
        .flat_map(|p| p.split("\r\n\r\n"))
        .map(|p| p.trim_matches(|c| c == '\n' || c == '\r'))
        .filter(|p| !p.trim().is_empty())
}

/// `# Title` → (1, "Title").
fn heading(line: &str) -> Option<(u8, &str)> {
    let t = line.trim_start();
    let hashes = t.bytes().take_while(|&b| b == b'#').count();
    if !(1..=6).contains(&hashes) || line.len() - t.len() > 3 {
        return None;
    }
    let rest = &t[hashes..];
    if !rest.starts_with(' ') || rest.trim().is_empty() {
        return None;
    }
    Some((hashes as u8, rest.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::extract;

    #[test]
    fn markdown_headings_tables_and_lists() {
        let md = "# Policy\n\nIntro text.\n\n## 4.2 Limits\n\n| Segment | Limit |\n|---|---|\n| Retail | 250k |\n\n- one\n- two\n\n# Annex\n\nEnd.";
        let x = extract(md.as_bytes(), Format::Markdown, &Limits::default()).unwrap();
        assert_eq!(x.title.as_deref(), Some("Policy"));
        let t = x
            .blocks
            .iter()
            .find(|b| matches!(b.kind, BlockKind::Table { .. }))
            .unwrap();
        assert_eq!(t.text, "Segment | Limit\nRetail | 250k");
        assert_eq!(t.table_header(), Some("Segment | Limit"));
        assert_eq!(t.anchor.section, vec!["Policy", "4.2 Limits"]);
        let items: Vec<_> = x
            .blocks
            .iter()
            .filter(|b| b.kind == BlockKind::ListItem)
            .collect();
        assert_eq!(items.len(), 2);
        assert_eq!(x.blocks.last().unwrap().anchor.section, vec!["Annex"]);
    }
}
