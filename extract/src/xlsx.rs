//! XLSX/XLSM through `calamine` (cell by cell, never a dense range: a sheet claiming
//! A1:XFD1048576 costs what its cells cost): one section per sheet, up to three one-cell title
//! rows above the table as headings under it, the first row after them as the header, formulas
//! as their cached values, anchors sheet + row range.

use std::collections::BTreeMap;
use std::io::Cursor;

use calamine::{DataRef, Reader, Xlsx};

use crate::csv::push_table;
use crate::limits::Budget;
use crate::xml::{Ev, Zip, core_title, tag};
use crate::{Anchor, Block, BlockKind, Extracted, Format, Limits, Refusal};

/// At most this many one-cell rows above a sheet's table are read as its title lines.
const MAX_TITLE_ROWS: usize = 3;

pub(crate) fn extract(
    bytes: &[u8],
    limits: &Limits,
    budget: &mut Budget,
) -> Result<Extracted, Refusal> {
    // The guards first, over every entry whatever its name (calamine finds worksheets through
    // the relationships, so a sheet need not be called `*.xml`): actual decompressed bytes
    // counted, and every part that is XML walked for DTDs, nesting, text size and the number
    // of shared strings (at most one per cell). Only then does calamine read the same parts.
    let mut zip = Zip::open(bytes, Format::Xlsx, limits)?;
    let title = core_title(&mut zip, limits)?;
    check_parts(&mut zip, limits)?;
    let mut wb: Xlsx<_> = calamine::open_workbook_from_rs(Cursor::new(bytes))
        .map_err(|e| Refusal::malformed(Format::Xlsx, e))?;
    let sheets = wb.sheet_names();
    if sheets.len() as u64 > u64::from(limits.max_sheets) {
        return Err(Refusal::limit(
            "max_sheets",
            sheets.len(),
            limits.max_sheets,
        ));
    }
    let mut out = Extracted {
        title,
        ..Extracted::default()
    };
    // The cells' text kept before a sheet's blocks are built: it becomes block text, so it is
    // held to the same limit while it is read.
    let mut cell_bytes: u64 = 0;
    for sheet in &sheets {
        let rows = sheet_rows(&mut wb, sheet, limits, budget, &mut cell_bytes)?;
        out.units += 1;
        if rows.is_empty() {
            continue;
        }
        push_sheet(sheet, rows, budget, &mut out.blocks)?;
    }
    if out.title.is_none() {
        out.title = sheets.first().cloned();
    }
    Ok(out)
}

/// Every part walked with the XML guards, shared strings counted against `max_cells`.
fn check_parts(zip: &mut Zip<'_>, limits: &Limits) -> Result<(), Refusal> {
    let mut strings: u64 = 0;
    for name in zip.names() {
        zip.check_part(&name, limits, |ev| {
            if let Ev::Start(s) = ev
                && tag(s) == b"si"
            {
                strings += 1;
                if strings > limits.max_cells {
                    return Err(Refusal::limit("max_cells", strings, limits.max_cells));
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// A sheet's non-empty cells by row (0-based) as (column, text), each counted against the
/// budget and the cells' text so far against `max_text_bytes`.
fn sheet_rows(
    wb: &mut Xlsx<Cursor<&[u8]>>,
    sheet: &str,
    limits: &Limits,
    budget: &mut Budget,
    cell_bytes: &mut u64,
) -> Result<BTreeMap<u32, Vec<(u32, String)>>, Refusal> {
    let mut rows: BTreeMap<u32, Vec<(u32, String)>> = BTreeMap::new();
    let mut reader = wb
        .worksheet_cells_reader(sheet)
        .map_err(|e| Refusal::malformed(Format::Xlsx, format!("sheet {sheet}: {e}")))?;
    while let Some(cell) = reader
        .next_cell()
        .map_err(|e| Refusal::malformed(Format::Xlsx, format!("sheet {sheet}: {e}")))?
    {
        let v = value(cell.get_value());
        if v.is_empty() {
            continue;
        }
        budget.cell()?;
        *cell_bytes += v.len() as u64;
        if *cell_bytes > limits.max_text_bytes {
            return Err(Refusal::limit(
                "max_text_bytes",
                *cell_bytes,
                limits.max_text_bytes,
            ));
        }
        let (r, c) = cell.get_position();
        rows.entry(r).or_default().push((c, v));
    }
    Ok(rows)
}

/// A non-empty sheet's blocks: its heading, its title lines, then its table.
fn push_sheet(
    sheet: &str,
    mut rows: BTreeMap<u32, Vec<(u32, String)>>,
    budget: &mut Budget,
    blocks: &mut Vec<Block>,
) -> Result<(), Refusal> {
    let mut anchor = Anchor {
        sheet: Some(sheet.to_owned()),
        section: vec![sheet.to_owned()],
        ..Anchor::default()
    };
    budget.push(
        blocks,
        Block {
            kind: BlockKind::Heading(1),
            text: sheet.to_owned(),
            anchor: anchor.clone(),
        },
    )?;
    push_title_rows(&mut rows, &mut anchor, budget, blocks)?;
    let line = row_line(&rows);
    let mut it = rows.iter();
    let (hr, header) = it.next().map(|(r, c)| (*r, line(c))).unwrap_or_default();
    let data: Vec<(u32, String)> = it.map(|(r, c)| (r + 1, line(c))).collect();
    if data.is_empty() {
        let mut a = anchor.clone();
        a.rows = Some((hr + 1, hr + 1));
        budget.push(
            blocks,
            Block {
                kind: BlockKind::Table { header_rows: 1 },
                text: header,
                anchor: a,
            },
        )
    } else {
        push_table(blocks, budget, &header, &data, &anchor)
    }
}

/// Title lines: a sheet often starts with its caption in A1 ("Bradwell Station Road branch
/// limits"), maybe a subtitle, then the table. A leading row of one cell while a later row has
/// several is such a line: it becomes a heading under the sheet's (so every chunk of the table
/// carries it in its section path), never the table's header.
fn push_title_rows(
    rows: &mut BTreeMap<u32, Vec<(u32, String)>>,
    anchor: &mut Anchor,
    budget: &mut Budget,
    blocks: &mut Vec<Block>,
) -> Result<(), Refusal> {
    let mut titles = 0;
    while rows.len() > 1 && titles < MAX_TITLE_ROWS {
        let (&r, first) = rows.iter().next().expect("non-empty");
        if first.len() != 1 || !rows.values().skip(1).any(|c| c.len() > 1) {
            break;
        }
        let text = first[0].1.clone();
        rows.remove(&r);
        titles += 1;
        anchor.section.push(text.clone());
        let mut a = anchor.clone();
        a.rows = Some((r + 1, r + 1));
        budget.push(
            blocks,
            Block {
                kind: BlockKind::Heading(2),
                text,
                anchor: a,
            },
        )?;
    }
    Ok(())
}

/// A row's text: its cells in their columns (empty ones kept) when the sheet spans at most 65
/// columns, else the non-empty cells only; `" | "` between.
fn row_line(rows: &BTreeMap<u32, Vec<(u32, String)>>) -> impl Fn(&[(u32, String)]) -> String {
    let min_c = rows
        .values()
        .flat_map(|r| r.iter().map(|(c, _)| *c))
        .min()
        .unwrap_or(0);
    let max_c = rows
        .values()
        .flat_map(|r| r.iter().map(|(c, _)| *c))
        .max()
        .unwrap_or(0);
    move |cells: &[(u32, String)]| -> String {
        if max_c - min_c <= 64 {
            let mut v = vec![""; (max_c - min_c + 1) as usize];
            for (c, s) in cells {
                v[(c - min_c) as usize] = s;
            }
            v.join(" | ")
        } else {
            cells
                .iter()
                .map(|(_, s)| s.as_str())
                .collect::<Vec<_>>()
                .join(" | ")
        }
    }
}

/// A cell's display text: numbers without float noise, dates as ISO dates.
fn value(v: &DataRef<'_>) -> String {
    let s = match v {
        DataRef::Empty => String::new(),
        DataRef::String(s) => s.clone(),
        DataRef::SharedString(s) => (*s).to_owned(),
        DataRef::Int(i) => i.to_string(),
        DataRef::Float(f) => number(*f),
        DataRef::Bool(b) => if *b { "TRUE" } else { "FALSE" }.to_owned(),
        DataRef::DateTime(d) => serial_date(d.as_f64(), d.is_datetime()),
        DataRef::DateTimeIso(s) | DataRef::DurationIso(s) => s.clone(),
        DataRef::Error(e) => format!("#{e:?}"),
    };
    s.trim().replace(['\n', '\r'], " ").replace(" | ", " / ")
}

fn number(f: f64) -> String {
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        let s = format!("{f:.10}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_owned()
    }
}

/// An Excel serial date (1900 system, days since 1899-12-30) as `YYYY-MM-DD[ HH:MM]`.
fn serial_date(serial: f64, with_time: bool) -> String {
    if !serial.is_finite() || !(0.0..3_000_000.0).contains(&serial) {
        return number(serial);
    }
    let days = serial.floor() as i64;
    // Civil-from-days (Howard Hinnant), from 1970-01-01 = serial 25569.
    let z = days - 25569 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    let mins = ((serial - serial.floor()) * 1440.0).round() as i64;
    if with_time && mins > 0 {
        format!("{y:04}-{m:02}-{d:02} {:02}:{:02}", mins / 60, mins % 60)
    } else {
        format!("{y:04}-{m:02}-{d:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_dates_display_as_a_person_reads_them() {
        assert_eq!(number(410.0), "410");
        assert_eq!(number(4.1), "4.1");
        assert_eq!(number(0.1 + 0.2), "0.3");
        assert_eq!(serial_date(45444.0, false), "2024-06-01");
        assert_eq!(serial_date(45444.5, true), "2024-06-01 12:00");
    }
}
