//! Hostile files generated on demand (feature `testing`): tens or hundreds of megabytes once
//! inflated, kilobytes on disk, so they are made by the tests instead of committed. Used by
//! this crate's tests and by the appliance's tests of the extraction budget (issue 42).

use std::io::Write;

const MIB: usize = 1 << 20;

/// Writes `n` bytes of `unit` repeated into `w`, without building them in memory.
pub fn repeat(w: &mut (impl Write + ?Sized), unit: &[u8], n: usize) {
    let chunk: Vec<u8> = unit
        .iter()
        .copied()
        .cycle()
        .take(MIB - MIB % unit.len())
        .collect();
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        w.write_all(&chunk[..k]).expect("in memory");
        left -= k;
    }
}

/// The zlib (`FlateDecode`) compression of what `write` writes.
pub fn zlib(write: impl FnOnce(&mut flate2::write::ZlibEncoder<Vec<u8>>)) -> Vec<u8> {
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    write(&mut z);
    z.finish().expect("in memory")
}

/// A PDF of `pages` pages that all share one content stream, `content` (compressed, as
/// `FlateDecode`), with Helvetica as `/F1` and form XObject `/X` whose content is `form`
/// (compressed). `extra` objects are appended as they are (numbered from 7).
pub fn pdf(pages: usize, content: &[u8], form: &[u8], extra: &[&[u8]]) -> Vec<u8> {
    let kids: Vec<String> = (0..pages)
        .map(|i| format!("{} 0 R", 7 + extra.len() + i))
        .collect();
    let mut objects: Vec<Vec<u8>> = vec![
        b"<< /Type /Catalog /Pages 2 0 R >>".to_vec(),
        format!(
            "<< /Type /Pages /Kids [{}] /Count {pages} /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> /XObject << /X 6 0 R >> >> >>",
            kids.join(" ")
        )
        .into_bytes(),
        b"<< /Type /Metadata >>".to_vec(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_vec(),
    ];
    for (dict, data) in [
        ("", content),
        (
            "/Type /XObject /Subtype /Form /BBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> ",
            form,
        ),
    ] {
        let mut o = format!(
            "<< {dict}/Length {} /Filter /FlateDecode >>\nstream\n",
            data.len()
        )
        .into_bytes();
        o.extend_from_slice(data);
        o.extend_from_slice(b"\nendstream");
        objects.push(o);
    }
    objects.extend(extra.iter().map(|e| e.to_vec()));
    for _ in 0..pages {
        objects.push(b"<< /Type /Page /Parent 2 0 R /Contents 5 0 R >>".to_vec());
    }
    let mut out = b"%PDF-1.4\n".to_vec();
    let mut offsets = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n", i + 1).as_bytes());
        out.extend_from_slice(o);
        out.extend_from_slice(b"\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", objects.len() + 1).as_bytes(),
    );
    for off in offsets {
        out.extend_from_slice(format!("{off:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            objects.len() + 1
        )
        .as_bytes(),
    );
    out
}

/// What writes the bytes of one zip entry.
pub type Writer<'a> = Box<dyn FnOnce(&mut dyn Write) + 'a>;

/// One entry of [`zip`]: its name and what writes its bytes.
pub type Entry<'a> = (&'a str, Writer<'a>);

/// A zip container, every entry deflated (sizes declared truthfully).
pub fn zip(entries: Vec<Entry<'_>>) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    for (name, write) in entries {
        z.start_file(name, opts).expect("in memory");
        write(&mut z);
    }
    z.finish().expect("in memory").into_inner()
}

/// An entry of fixed bytes.
pub fn part(bytes: &[u8]) -> Writer<'_> {
    Box::new(move |w: &mut dyn Write| w.write_all(bytes).expect("in memory"))
}

/// H1: a 16 MiB form (comments, so no operation cap stops it; one line of text) drawn 40
/// times on one page: 640 MiB of content to interpret from a 20 KB file.
pub fn pdf_form_redrawn() -> Vec<u8> {
    let form = zlib(|z| {
        z.write_all(b"BT /F1 12 Tf 72 700 Td (Logo) Tj ET\n")
            .expect("in memory");
        repeat(
            z,
            b"% padding padding padding padding padding padding pad\n",
            16 * MIB,
        );
    });
    let content = zlib(|z| repeat(z, b"/X Do\n", 40 * 6));
    pdf(1, &content, &form, &[])
}

/// H1, within every extractor limit: `pages` pages sharing a content stream that draws a
/// one-operation form a million times (2 million operations a page, the per-page cap), about
/// 18 MB of content a page. Slow by design: only a CPU or time budget stops it early.
pub fn pdf_redraw_cpu(pages: usize) -> Vec<u8> {
    let form = zlib(|z| z.write_all(b"0 0 m\n").expect("in memory"));
    let content = zlib(|z| {
        z.write_all(b"BT /F1 12 Tf 72 700 Td (Slow) Tj ET\n")
            .expect("in memory");
        repeat(z, b"/X Do\n", 6 * 1_000_000);
    });
    pdf(pages, &content, &form, &[])
}

/// H2: one `TJ` array of 3 million one-letter strings: 9 MB of content from 20 KB.
pub fn pdf_huge_operand() -> Vec<u8> {
    let content = zlib(|z| {
        z.write_all(b"BT /F1 12 Tf 72 700 Td [").expect("in memory");
        repeat(z, b"(a)", 3 * 3_000_000);
        z.write_all(b"] TJ ET\n").expect("in memory");
    });
    pdf(1, &content, &zlib(|_| {}), &[])
}

/// Within every extractor limit, a memory bomb for the PDF parser itself: an array object of
/// `elements` zeros (two bytes each in the file, tens of bytes each once parsed), and one line
/// of text.
pub fn pdf_array_bomb(elements: usize) -> Vec<u8> {
    let mut array = b"[".to_vec();
    repeat(&mut array, b"0 ", 2 * elements);
    array.push(b']');
    let content = zlib(|z| {
        z.write_all(b"BT /F1 12 Tf 72 700 Td (Big) Tj ET\n")
            .expect("in memory")
    });
    pdf(1, &content, &zlib(|_| {}), &[&array])
}

/// `n` bytes that do not compress (a thumbnail, say): they keep a bomb's file large enough for
/// its expansion ratio to pass `max_zip_ratio`.
pub fn noise(n: usize) -> Writer<'static> {
    Box::new(move |w: &mut dyn Write| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut buf = Vec::with_capacity(n);
        for _ in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf.push((x >> 24) as u8);
        }
        w.write_all(&buf).expect("in memory");
    })
}

/// H2: a DOCX whose `word/document.xml` holds one run of `mib` MiB of text, plus `pad` bytes
/// of noise (sizes declared truthfully: with enough noise its ratio passes `max_zip_ratio`).
pub fn docx_bomb(mib: usize, pad: usize) -> Vec<u8> {
    zip(vec![
        ("docProps/thumbnail.jpeg", noise(pad)),
        (
            "[Content_Types].xml",
            part(b"<?xml version=\"1.0\"?><Types/>"),
        ),
        (
            "word/document.xml",
            Box::new(move |w: &mut dyn Write| {
                w.write_all(b"<w:document xmlns:w=\"w\"><w:body><w:p><w:r><w:t>")
                    .expect("in memory");
                repeat(w, b"a", mib * MIB);
                w.write_all(b"</w:t></w:r></w:p></w:body></w:document>")
                    .expect("in memory");
            }),
        ),
    ])
}

/// H2: an XLSX whose worksheet part is `xl/worksheets/sheet1.bin` (found through the
/// workbook's relationships, whatever its name), four cells of `mib_per_cell` MiB of text, plus
/// `pad` bytes of noise.
pub fn xlsx_bin_sheet(mib_per_cell: usize, pad: usize) -> Vec<u8> {
    let sheet = move |w: &mut dyn Write| {
        w.write_all(
            b"<worksheet xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\"><sheetData><row r=\"1\">",
        )
        .expect("in memory");
        for col in ["A", "B", "C", "D"] {
            w.write_all(format!("<c r=\"{col}1\" t=\"inlineStr\"><is><t>").as_bytes())
                .expect("in memory");
            repeat(w, b"x", mib_per_cell * MIB);
            w.write_all(b"</t></is></c>").expect("in memory");
        }
        w.write_all(b"</row></sheetData></worksheet>")
            .expect("in memory");
    };
    zip(vec![
        (
            "[Content_Types].xml",
            part(b"<?xml version=\"1.0\"?><Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\"><Default Extension=\"xml\" ContentType=\"application/xml\"/><Default Extension=\"rels\" ContentType=\"application/vnd.openxmlformats-package.relationships+xml\"/><Default Extension=\"bin\" ContentType=\"application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml\"/><Override PartName=\"/xl/workbook.xml\" ContentType=\"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml\"/></Types>"),
        ),
        (
            "_rels/.rels",
            part(b"<?xml version=\"1.0\"?><Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\"><Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument\" Target=\"xl/workbook.xml\"/></Relationships>"),
        ),
        (
            "xl/workbook.xml",
            part(b"<?xml version=\"1.0\"?><workbook xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\" xmlns:r=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships\"><sheets><sheet name=\"Rates\" sheetId=\"1\" r:id=\"rId1\"/></sheets></workbook>"),
        ),
        (
            "xl/_rels/workbook.xml.rels",
            part(b"<?xml version=\"1.0\"?><Relationships xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\"><Relationship Id=\"rId1\" Type=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet\" Target=\"worksheets/sheet1.bin\"/></Relationships>"),
        ),
        ("xl/worksheets/sheet1.bin", Box::new(sheet)),
        ("docProps/thumbnail.jpeg", noise(pad)),
    ])
}

/// H1: `depth` nested `div`s around a word.
pub fn deep_html(depth: usize) -> Vec<u8> {
    let mut h = b"<div>".repeat(depth);
    h.extend_from_slice(b"deep");
    h
}
