//! CSV (RFC 4180: quoted fields, doubled quotes, CRLF or LF): the first row is the header; the
//! data rows become table blocks of at most [`ROWS_PER_BLOCK`] rows, each led by the header.

use crate::limits::Budget;
use crate::{Anchor, Block, BlockKind, Extracted, Format, Refusal};

/// Data rows per table block (each block repeats the header line).
pub(crate) const ROWS_PER_BLOCK: usize = 50;

pub(crate) fn extract(bytes: &[u8], budget: &mut Budget) -> Result<Extracted, Refusal> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| {
        Refusal::malformed(
            Format::Csv,
            format!("invalid UTF-8 at byte {}", e.valid_up_to()),
        )
    })?;
    let rows = parse(text, budget)?;
    let mut out = Extracted::default();
    let Some((header, data)) = rows.split_first() else {
        return Err(Refusal::Empty);
    };
    let header = header.join(" | ");
    let numbered: Vec<(u32, String)> = data
        .iter()
        .enumerate()
        .filter(|(_, r)| r.iter().any(|c| !c.trim().is_empty()))
        .map(|(i, r)| ((i + 2) as u32, r.join(" | ")))
        .collect();
    push_table(
        &mut out.blocks,
        budget,
        &header,
        &numbered,
        &Anchor::default(),
    )?;
    if numbered.is_empty() {
        budget.push(
            &mut out.blocks,
            Block {
                kind: BlockKind::Table { header_rows: 1 },
                text: header,
                anchor: Anchor {
                    rows: Some((1, 1)),
                    ..Anchor::default()
                },
            },
        )?;
    }
    out.units = 1;
    Ok(out)
}

/// Pushes `rows` (sheet row number, "a | b" line) as table blocks led by `header`, with their
/// row ranges (the header's own row is not in the range).
pub(crate) fn push_table(
    out: &mut Vec<Block>,
    budget: &mut Budget,
    header: &str,
    rows: &[(u32, String)],
    base: &Anchor,
) -> Result<(), Refusal> {
    for group in rows.chunks(ROWS_PER_BLOCK) {
        let mut text = String::with_capacity(header.len() + group.len() * 32);
        text.push_str(header);
        for (_, r) in group {
            text.push('\n');
            text.push_str(r);
        }
        let mut anchor = base.clone();
        anchor.rows = Some((group[0].0, group[group.len() - 1].0));
        budget.push(
            out,
            Block {
                kind: BlockKind::Table { header_rows: 1 },
                text,
                anchor,
            },
        )?;
    }
    Ok(())
}

fn parse(text: &str, budget: &mut Budget) -> Result<Vec<Vec<String>>, Refusal> {
    let mut rows = Vec::new();
    let mut row: Vec<String> = Vec::new();
    let mut field = String::new();
    let mut chars = text.chars().peekable();
    let mut quoted = false;
    let mut at_start = true;
    while let Some(c) = chars.next() {
        if quoted {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    quoted = false;
                }
            } else {
                field.push(c);
            }
            continue;
        }
        match c {
            '"' if at_start => {
                quoted = true;
                at_start = false;
            }
            ',' => {
                end_field(&mut row, &mut field, budget)?;
                at_start = true;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' => {
                end_field(&mut row, &mut field, budget)?;
                rows.push(std::mem::take(&mut row));
                at_start = true;
            }
            _ => {
                field.push(c);
                at_start = false;
            }
        }
    }
    if quoted {
        return Err(Refusal::malformed(Format::Csv, "unterminated quoted field"));
    }
    if !field.is_empty() || !row.is_empty() {
        end_field(&mut row, &mut field, budget)?;
        rows.push(row);
    }
    Ok(rows)
}

fn end_field(
    row: &mut Vec<String>,
    field: &mut String,
    budget: &mut Budget,
) -> Result<(), Refusal> {
    let f = std::mem::take(field);
    if !f.trim().is_empty() {
        budget.cell()?;
    }
    // A cell's own line breaks and separators would break the one-row-per-line layout.
    row.push(f.trim().replace(['\n', '\r'], " ").replace(" | ", " / "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{BlockKind, Format, Limits, Refusal, extract};

    #[test]
    fn header_and_rows_with_quotes() {
        let csv = "Branch,City,Note\r\n\"Harbour St\",Portsmouth,\"says \"\"hi\"\", twice\"\r\nOld Town,Edinburgh,\r\n";
        let x = extract(csv.as_bytes(), Format::Csv, &Limits::default()).unwrap();
        assert_eq!(x.blocks.len(), 1);
        let b = &x.blocks[0];
        assert_eq!(b.kind, BlockKind::Table { header_rows: 1 });
        assert_eq!(
            b.text,
            "Branch | City | Note\nHarbour St | Portsmouth | says \"hi\", twice\nOld Town | Edinburgh | "
        );
        assert_eq!(b.anchor.rows, Some((2, 3)));
    }

    #[test]
    fn long_files_split_with_the_header_repeated_and_cells_are_limited() {
        let mut csv = String::from("a,b\n");
        for i in 0..120 {
            csv.push_str(&format!("{i},x\n"));
        }
        let x = extract(csv.as_bytes(), Format::Csv, &Limits::default()).unwrap();
        assert_eq!(x.blocks.len(), 3);
        assert!(x.blocks.iter().all(|b| b.text.starts_with("a | b\n")));
        assert_eq!(x.blocks[2].anchor.rows, Some((102, 121)));
        let limits = Limits {
            max_cells: 100,
            ..Limits::default()
        };
        assert!(matches!(
            extract(csv.as_bytes(), Format::Csv, &limits),
            Err(Refusal::LimitExceeded {
                what: "max_cells",
                ..
            })
        ));
        assert!(matches!(
            extract(b"a,\"b\n", Format::Csv, &Limits::default()),
            Err(Refusal::Malformed { .. })
        ));
    }
}
