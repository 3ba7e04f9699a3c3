#!/usr/bin/env python3
"""Builds the document-extraction test files from the bank-dev corpus with third-party writers.

Writers: reportlab (PDF), python-docx (DOCX), XlsxWriter (XLSX, with cached formula values),
python-pptx (PPTX), the stdlib `email` and `csv` packages. The hostile files are assembled by
hand with `zipfile`/`zlib` (no writer produces a zip bomb on purpose).

    python3 -m venv /tmp/docvenv
    /tmp/docvenv/bin/pip install reportlab python-docx XlsxWriter python-pptx
    /tmp/docvenv/bin/python scripts/gen-doc-fixtures.py                  # fixtures
    /tmp/docvenv/bin/python scripts/gen-doc-fixtures.py --convert-corpus OUT   # whole corpus
    /tmp/docvenv/bin/python scripts/gen-doc-fixtures.py --bench-pdf OUT.pdf --pages 200 [--first-doc K]

Fixtures go to extract/tests/fixtures/ (committed, so tests need no Python). The corpus
conversion writes OUT/<doc_id>.<ext> plus OUT/.manifest.jsonl (doc_id, file, format, title);
it is for the quality measurement and is not committed.
"""

import argparse
import csv
import io
import json
import os
import re
import sys
import zipfile
import zlib
from email.message import EmailMessage
from email.utils import format_datetime
from datetime import datetime, timezone

from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.pdfbase.pdfmetrics import stringWidth
from reportlab.pdfgen import canvas
from reportlab.platypus import Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle
from reportlab.lib.pdfencrypt import StandardEncryption

import docx
import xlsxwriter
from pptx import Presentation
from pptx.util import Inches, Pt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CORPUS = os.path.join(ROOT, "..", "shared", "datasets", "bank-dev", "corpus.jsonl")
DEFAULT_OUT = os.path.join(ROOT, "extract", "tests", "fixtures")
FIXED_DATE = datetime(2024, 5, 27, 9, 30, tzinfo=timezone.utc)


# --- the corpus text's own structure ---------------------------------------------------------

def blocks_of(text):
    """Splits a bank-dev text into ("heading", str) / ("para", str) / ("table", rows) blocks.

    Headings are short lines ending in ':' alone in their paragraph; tables are Markdown pipe
    tables or space-aligned tables with a dashed rule under the header."""
    out = []
    for para in re.split(r"\n\s*\n", text.strip()):
        lines = [l for l in para.split("\n") if l.strip()]
        if not lines:
            continue
        if all(l.strip().startswith("|") for l in lines) and len(lines) >= 2:
            rows = [[c.strip() for c in l.strip().strip("|").split("|")] for l in lines]
            rows = [r for r in rows if not all(re.fullmatch(r":?-{2,}:?", c) for c in r)]
            out.append(("table", rows))
        elif len(lines) >= 3 and re.fullmatch(r"[- ]+", lines[1]) and "-" in lines[1]:
            spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[1])]
            rows = []
            for l in [lines[0]] + lines[2:]:
                cells = []
                for i, (s, _) in enumerate(spans):
                    e = spans[i + 1][0] if i + 1 < len(spans) else len(l)
                    cells.append(l[s:e].strip())
                rows.append(cells)
            out.append(("table", rows))
        elif len(lines) == 1 and lines[0].endswith(":") and len(lines[0]) < 60:
            out.append(("heading", lines[0][:-1].strip()))
        else:
            out.append(("para", " ".join(l.strip() for l in lines)))
    return out


# --- PDF helpers -----------------------------------------------------------------------------

def wrap_hyphenated(text, font, size, width):
    """Greedy wrap; a long word that does not fit is split with a hyphen at the line end."""
    lines, cur = [], ""
    for word in text.split():
        cand = (cur + " " + word).strip()
        if stringWidth(cand, font, size) <= width:
            cur = cand
            continue
        if len(word) >= 8 and word.isalpha():
            for cut in range(len(word) - 3, 2, -1):
                head = (cur + " " + word[:cut] + "-").strip()
                if stringWidth(head, font, size) <= width:
                    lines.append(head)
                    cur = word[cut:]
                    break
            else:
                lines.append(cur)
                cur = word
        else:
            if cur:
                lines.append(cur)
            cur = word
    if cur:
        lines.append(cur)
    return lines


def draw_blocks(c, blocks, x, y, width, bottom, top, new_page, size=10):
    """Draws heading/para blocks in a column; returns the y after the last line."""
    lead = size * 1.35
    for kind, val in blocks:
        if kind == "table":
            val = "; ".join(" | ".join(r) for r in val)
            kind = "para"
        font = "Helvetica-Bold" if kind == "heading" else "Helvetica"
        fsize = size + 2 if kind == "heading" else size
        for line in wrap_hyphenated(val, font, fsize, width):
            if y < bottom:
                x, y = new_page()
            c.setFont(font, fsize)
            c.drawString(x, y, line)
            y -= lead
        y -= lead * 0.6
    return x, y


def pdf_plain(path, doc):
    c = canvas.Canvas(path, pagesize=A4, invariant=1)
    c.setTitle(doc["title"])
    w, h = A4
    c.setFont("Helvetica-Bold", 16)
    c.drawString(20 * mm, h - 25 * mm, doc["title"])
    state = {"page": 1}

    def new_page():
        c.showPage()
        state["page"] += 1
        return 20 * mm, h - 25 * mm

    draw_blocks(c, blocks_of(doc["text"]), 20 * mm, h - 35 * mm, w - 40 * mm, 20 * mm, h, new_page)
    c.save()


def pdf_two_columns(path, left, right):
    """One page, two columns: left column is document `left`, right column `right`."""
    c = canvas.Canvas(path, pagesize=A4, invariant=1)
    c.setTitle("Two-column bulletin")
    w, h = A4
    c.setFont("Helvetica-Bold", 15)
    c.drawString(20 * mm, h - 20 * mm, "Halcyon Bank staff bulletin")
    colw = (w - 50 * mm) / 2
    for i, doc in enumerate((left, right)):
        x = 20 * mm + i * (colw + 10 * mm)
        blocks = [("heading", doc["title"])] + blocks_of(doc["text"])[:6]

        def no_page():
            raise RuntimeError("column overflow")

        draw_blocks(c, blocks, x, h - 32 * mm, colw, 15 * mm, h, no_page, size=8)
    c.save()


def pdf_table_two_pages(path, rows_n=70):
    """A rate table spanning two pages, header row repeated, running header and footer."""
    styles = getSampleStyleSheet()

    def decorate(c, d):
        c.saveState()
        c.setFont("Helvetica", 8)
        c.drawString(20 * mm, A4[1] - 12 * mm, "Halcyon Bank - Treasury - Deposit rate sheet")
        c.drawString(20 * mm, 10 * mm, f"Internal use only. Page {d.page}")
        c.restoreState()

    d = SimpleDocTemplate(path, pagesize=A4, invariant=1, title="Deposit rate sheet",
                          topMargin=20 * mm, bottomMargin=20 * mm)
    data = [["Product", "Term (months)", "Rate (%)", "Min balance (USD)"]]
    products = ["Fixed Saver", "Notice Account", "Business Reserve", "Premier Bond"]
    for i in range(rows_n):
        data.append([f"{products[i % 4]} {i + 1}", str(3 + 3 * (i % 20)),
                     f"{1.25 + 0.05 * i:.2f}", f"{1000 * (1 + i % 9):,}"])
    t = Table(data, repeatRows=1, colWidths=[60 * mm, 30 * mm, 25 * mm, 40 * mm])
    t.setStyle(TableStyle([("FONT", (0, 0), (-1, 0), "Helvetica-Bold"),
                           ("GRID", (0, 0), (-1, -1), 0.25, colors.grey)]))
    story = [Paragraph("Deposit rate sheet", styles["Title"]),
             Paragraph("Rates apply from 1 June 2024 to new accounts only.", styles["Normal"]),
             Spacer(1, 6 * mm), t,
             Spacer(1, 6 * mm),
             Paragraph("Rates are reviewed monthly by the Treasury committee.", styles["Normal"])]
    d.build(story, onFirstPage=decorate, onLaterPages=decorate)


def pdf_scanned(path):
    """A page whose only content is a raster image of text (no text layer)."""
    from PIL import Image, ImageDraw
    img = Image.new("L", (400, 120), 255)
    dr = ImageDraw.Draw(img)
    dr.text((10, 10), "SCANNED: Credit committee minutes, 3 March 2024", fill=0)
    dr.text((10, 40), "Approved limit USD 2,500,000 for Wolfhall Telecom.", fill=0)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    buf.seek(0)
    from reportlab.lib.utils import ImageReader
    c = canvas.Canvas(path, pagesize=A4, invariant=1)
    c.drawImage(ImageReader(buf), 20 * mm, A4[1] - 80 * mm, width=160 * mm, height=48 * mm)
    c.save()


def pdf_encrypted(path, doc):
    enc = StandardEncryption("reader-secret", ownerPassword="owner-secret", strength=128)
    c = canvas.Canvas(path, pagesize=A4, invariant=1, encrypt=enc)
    c.setFont("Helvetica", 11)
    c.drawString(20 * mm, A4[1] - 30 * mm, doc["title"])
    c.save()


def pdf_bytes(doc):
    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=A4, invariant=1)
    c.setTitle(doc["title"])
    w, h = A4

    def new_page():
        c.showPage()
        return 20 * mm, h - 25 * mm

    c.setFont("Helvetica-Bold", 14)
    c.drawString(20 * mm, h - 20 * mm, doc["title"])
    draw_blocks(c, blocks_of(doc["text"]), 20 * mm, h - 30 * mm, w - 40 * mm, 20 * mm, h,
                new_page)
    c.save()
    return buf.getvalue()


def pdf_from_doc_platypus(path, doc):
    """Corpus conversion: headings, paragraphs and real tables."""
    styles = getSampleStyleSheet()
    story = [Paragraph(esc(doc["title"]), styles["Title"])]
    for kind, val in blocks_of(doc["text"]):
        if kind == "heading":
            story.append(Paragraph(esc(val), styles["Heading2"]))
        elif kind == "para":
            story.append(Paragraph(esc(val), styles["Normal"]))
        else:
            t = Table(val, repeatRows=1)
            t.setStyle(TableStyle([("GRID", (0, 0), (-1, -1), 0.25, colors.grey),
                                   ("FONT", (0, 0), (-1, 0), "Helvetica-Bold")]))
            story.append(t)
        story.append(Spacer(1, 3 * mm))
    SimpleDocTemplate(path, pagesize=A4, invariant=1, title=doc["title"]).build(story)


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --- Office ----------------------------------------------------------------------------------

def docx_from_doc(path, doc, extra_list=None):
    d = docx.Document()
    d.core_properties.title = doc["title"]
    d.core_properties.created = FIXED_DATE.replace(tzinfo=None)
    d.core_properties.modified = FIXED_DATE.replace(tzinfo=None)
    d.add_heading(doc["title"], level=1)
    for kind, val in blocks_of(doc["text"]):
        if kind == "heading":
            d.add_heading(val, level=2)
        elif kind == "para":
            d.add_paragraph(val)
        else:
            t = d.add_table(rows=len(val), cols=max(len(r) for r in val))
            for i, r in enumerate(val):
                for j, cell in enumerate(r):
                    t.cell(i, j).text = cell
    if extra_list:
        d.add_heading("Checklist", level=2)
        for item in extra_list:
            d.add_paragraph(item, style="List Bullet")
    d.save(path)


def docx_policy(path):
    d = docx.Document()
    d.core_properties.title = "Credit Limits Policy"
    d.core_properties.created = FIXED_DATE.replace(tzinfo=None)
    d.core_properties.modified = FIXED_DATE.replace(tzinfo=None)
    d.add_heading("Credit Limits Policy", level=1)
    d.add_paragraph("This policy sets the lending limits that apply to every business line.")
    d.add_heading("4 Lending", level=2)
    d.add_paragraph("Limits are approved by the Credit Committee and reviewed every year.")
    d.add_heading("4.2 Limits", level=3)
    d.add_paragraph("The following limits apply per obligor group:")
    rows = [["Segment", "Limit (USD)", "Approver"],
            ["Retail", "250,000", "Branch manager"],
            ["SME", "2,500,000", "Regional credit officer"],
            ["Corporate", "25,000,000", "Credit Committee"]]
    t = d.add_table(rows=4, cols=3)
    for i, r in enumerate(rows):
        for j, cell in enumerate(r):
            t.cell(i, j).text = cell
    d.add_heading("4.3 Exceptions", level=3)
    for item in ["An exception needs two approvers.",
                 "Every exception is logged in the credit register.",
                 "Exceptions expire after 90 days."]:
        d.add_paragraph(item, style="List Bullet")
    d.add_paragraph("Steps to request an exception:")
    for item in ["Complete the exception form.", "Attach the credit memo.",
                 "Send both to the Credit Risk mailbox."]:
        d.add_paragraph(item, style="List Number")
    d.save(path)


def xlsx_rates(path):
    wb = xlsxwriter.Workbook(path)
    wb.set_properties({"title": "Rate sheet June 2024", "created": FIXED_DATE.replace(tzinfo=None)})
    ws = wb.add_worksheet("Deposit rates")
    ws.write_row(0, 0, ["Product", "Term (months)", "Rate (%)", "Interest on 10,000 (USD)"])
    products = [("Fixed Saver 12m", 12, 4.10), ("Fixed Saver 24m", 24, 3.85),
                ("Notice 95", 3, 3.20), ("Business Reserve", 1, 2.75), ("Premier Bond", 36, 3.60)]
    for i, (p, term, rate) in enumerate(products, start=1):
        ws.write_string(i, 0, p)
        ws.write_number(i, 1, term)
        ws.write_number(i, 2, rate)
        # The cached value is what Excel would show; XlsxWriter stores it with the formula.
        ws.write_formula(i, 3, f"=10000*C{i + 1}/100", None, round(10000 * rate / 100, 2))
    ws2 = wb.add_worksheet("Lending limits")
    ws2.write_row(0, 0, ["Segment", "Limit (USD)", "Approver"])
    for i, r in enumerate([["Retail", 250000, "Branch manager"],
                           ["SME", 2500000, "Regional credit officer"],
                           ["Corporate", 25000000, "Credit Committee"]], start=1):
        ws2.write_row(i, 0, r)
    wb.close()


def xlsx_from_doc(path, doc):
    wb = xlsxwriter.Workbook(path)
    wb.set_properties({"title": doc["title"], "created": FIXED_DATE.replace(tzinfo=None)})
    ws = wb.add_worksheet("Document")
    ws.write_row(0, 0, ["Section", "Text"])
    r = 1
    section = ""
    tables = []
    for kind, val in blocks_of(doc["text"]):
        if kind == "heading":
            section = val
        elif kind == "para":
            ws.write_row(r, 0, [section, val])
            r += 1
        else:
            tables.append((section, val))
    # Each table on a sheet of its own, as a person lays a workbook out: the sheet named after
    # the section that introduced the table, that section's heading as the title in A1, a blank
    # row, then the table (the header row first).
    names = set()
    for i, (caption, t) in enumerate(tables):
        name = re.sub(r"[\[\]:*?/\\']", " ", caption).strip()[:31].strip() or f"Table {i + 1}"
        if name.lower() in names or name.lower() == "document":
            name = f"Table {i + 1}"
        names.add(name.lower())
        ts = wb.add_worksheet(name)
        first = 0
        if caption:
            ts.write_string(0, 0, caption)
            first = 2
        for j, row in enumerate(t):
            ts.write_row(first + j, 0, row)
    wb.close()


def xlsx_titled(path):
    """Branch limits under a title row and a subtitle, as sheets are often laid out."""
    wb = xlsxwriter.Workbook(path)
    wb.set_properties({"title": "Branch cash limits", "created": FIXED_DATE.replace(tzinfo=None)})
    ws = wb.add_worksheet("Limits")
    ws.write_string(0, 0, "Bradwell Station Road branch limits")
    ws.write_string(1, 0, "Approved by Retail Operations, February 2024")
    ws.write_row(3, 0, ["Limit", "Amount (USD)"])
    ws.write_row(4, 0, ["Main vault", 834500])
    ws.write_row(5, 0, ["Teller drawer", 22450])
    ws2 = wb.add_worksheet("Codes")
    for i, c in enumerate(["BR-01", "BR-02", "BR-03"]):
        ws2.write_string(i, 0, c)
    wb.close()


def pptx_deck(path, slides):
    """slides: [(title, [bullets], notes)]"""
    prs = Presentation()
    prs.core_properties.title = slides[0][0]
    prs.core_properties.created = FIXED_DATE.replace(tzinfo=None)
    prs.core_properties.modified = FIXED_DATE.replace(tzinfo=None)
    for i, (title, bullets, notes) in enumerate(slides):
        layout = prs.slide_layouts[0 if i == 0 else 1]
        s = prs.slides.add_slide(layout)
        s.shapes.title.text = title
        body = s.placeholders[1].text_frame
        body.text = bullets[0] if bullets else ""
        for b in bullets[1:]:
            body.add_paragraph().text = b
        if notes:
            s.notes_slide.notes_text_frame.text = notes
    prs.save(path)


def pptx_committee(path):
    slides = [
        ("Credit Committee - Q2 2024", ["Portfolio review and limit requests"],
         "Welcome the committee; apologies from the CFO."),
        ("Portfolio quality", ["Non-performing loans at 1.8%", "Watch list: 14 names",
                               "Provisions up USD 3.2m"],
         "Stress the NPL ratio is below the 2.5% appetite."),
        ("Limit requests", ["Wolfhall Telecom: USD 2.5m revolving facility",
                            "Kestrel Foods: renewal at USD 800k"],
         "Wolfhall needs two approvers as an exception."),
    ]
    pptx_deck(path, slides)


def pptx_from_doc(path, doc):
    slides = [(doc["title"], [doc["metadata"].get("department", "")], "")]
    section = "Overview"
    bullets = []
    for kind, val in blocks_of(doc["text"]):
        if kind == "heading":
            if bullets:
                slides.append((section, bullets, ""))
            section, bullets = val, []
        elif kind == "para":
            bullets.append(val)
        else:
            bullets.extend(" | ".join(r) for r in val)
    if bullets:
        slides.append((section, bullets, ""))
    pptx_deck(path, slides)


# --- e-mail and CSV --------------------------------------------------------------------------

def eml_with_pdf(doc, attachment_doc, nested=None, body_chars=1500):
    """An e-mail with the document's text as its body (the first `body_chars` characters; all
    of it when None) and optionally another document as a PDF attachment."""
    m = EmailMessage()
    m["Subject"] = doc["title"]
    m["From"] = "Uma Bauer <uma.bauer@halcyon.example>"
    m["To"] = "Credit Risk <credit.risk@halcyon.example>"
    m["Date"] = format_datetime(FIXED_DATE)
    m["Message-ID"] = f"<{doc['doc_id']}@halcyon.example>"
    m.set_content(doc["text"] if body_chars is None else doc["text"][:body_chars])
    if attachment_doc is not None:
        m.add_attachment(pdf_bytes(attachment_doc), maintype="application", subtype="pdf",
                         filename="memo.pdf")
    if nested is not None:
        m.add_attachment(nested)
    return m


def eml_deep(depth):
    inner = EmailMessage()
    inner["Subject"] = "level 0"
    inner.set_content("innermost")
    for i in range(1, depth + 1):
        outer = EmailMessage()
        outer["Subject"] = f"level {i}"
        outer.set_content(f"wrapper {i}")
        outer.add_attachment(inner)
        inner = outer
    return inner


def csv_rates(path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Branch", "City", "Deposits (USD m)", "Loans (USD m)"])
        for row in [["Harbour Street", "Portsmouth", "412.5", "388.0"],
                    ["Kings Cross", "London", "1,204.1", "997.3"],
                    ["Old Town", "Edinburgh", "302.9", "251.4"],
                    ["Quayside", "Newcastle", "188.0", "201.7"]]:
            w.writerow(row)


# --- hostile files ---------------------------------------------------------------------------

CT_DOCX = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
           '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
           '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
           '<Default Extension="xml" ContentType="application/xml"/>'
           '<Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
           '</Types>')
RELS_DOCX = ('<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
             '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
             '<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/>'
             '</Relationships>')
W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'


def fixed_boundaries(msg, tag="airlock"):
    """Deterministic MIME boundaries (the stdlib draws random ones), so files regenerate equal."""
    for i, part in enumerate(msg.walk()):
        if part.is_multipart():
            part.set_boundary(f"=_{tag}_{i}_=")
    return msg


def normalize_zip(path):
    """Rewrites a writer's zip with fixed timestamps (python-docx/pptx stamp the current time)."""
    with zipfile.ZipFile(path) as z:
        entries = [(n, z.read(n)) for n in z.namelist()]
    write_zip(path, entries)


def write_zip(path, entries):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name, data in entries:
            zi = zipfile.ZipInfo(name, date_time=(2024, 5, 27, 9, 30, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data, compresslevel=9)


def docx_zip_bomb(path, mb=24):
    body = f'<w:document {W}><w:body><w:p><w:r><w:t>' + " " * (mb << 20) + '</w:t></w:r></w:p></w:body></w:document>'
    write_zip(path, [("[Content_Types].xml", CT_DOCX), ("_rels/.rels", RELS_DOCX),
                     ("word/document.xml", body)])


def docx_deep_nested(path, depth=5000):
    body = (f'<w:document {W}><w:body>' + "<w:sdt><w:sdtContent>" * depth + "<w:p><w:r><w:t>deep</w:t></w:r></w:p>"
            + "</w:sdtContent></w:sdt>" * depth + "</w:body></w:document>")
    write_zip(path, [("[Content_Types].xml", CT_DOCX), ("_rels/.rels", RELS_DOCX),
                     ("word/document.xml", body)])


def docx_many_entries(path, n=300):
    body = f'<w:document {W}><w:body><w:p><w:r><w:t>many parts</w:t></w:r></w:p></w:body></w:document>'
    entries = [("[Content_Types].xml", CT_DOCX), ("_rels/.rels", RELS_DOCX),
               ("word/document.xml", body)]
    entries += [(f"x/{i}", "") for i in range(n)]
    write_zip(path, entries)


def xlsx_billion_laughs(src, path):
    """The rate sheet with its shared strings replaced by a billion-laughs DTD."""
    lol = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
           + "".join(f'<!ENTITY lol{i} "' + f"&lol{i - 1};" * 10 + '">' if i > 1 else
                     '<!ENTITY lol1 "' + "&lol;" * 10 + '">' for i in range(1, 10))
           + ']><sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" count="1" uniqueCount="1">'
           '<si><t>&lol9;</t></si></sst>')
    with zipfile.ZipFile(src) as z:
        entries = [(n, z.read(n)) for n in z.namelist()]
    entries = [(n, lol if n == "xl/sharedStrings.xml" else d) for n, d in entries]
    write_zip(path, entries)


def pdf_raw(objects, root=1):
    """A classic-xref PDF from `{num: bytes}` object bodies."""
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offs = {}
    for num in sorted(objects):
        offs[num] = len(out)
        out += f"{num} 0 obj\n".encode() + objects[num] + b"\nendobj\n"
    xref = len(out)
    n = max(objects) + 1
    out += f"xref\n0 {n}\n0000000000 65535 f \n".encode()
    for i in range(1, n):
        out += (f"{offs[i]:010d} 00000 n \n" if i in offs else "0000000000 65535 f \n").encode()
    out += f"trailer\n<< /Size {n} /Root {root} 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def stream(dict_extra, data):
    return (b"<< /Length " + str(len(data)).encode() + b" " + dict_extra + b" >>\nstream\n"
            + data + b"\nendstream")


FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"


def pdf_xobject_cycle(path):
    """A page that draws a form XObject which draws itself (and a Pages tree with a cycle)."""
    form = stream(b"/Type /XObject /Subtype /Form /BBox [0 0 600 800] /Resources << /XObject << /X1 5 0 R >> /Font << /F1 6 0 R >> >>",
                  b"BT /F1 12 Tf 72 700 Td (loop) Tj ET /X1 Do")
    objs = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [3 0 R 7 0 R] /Count 2 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /XObject << /X1 5 0 R >> /Font << /F1 6 0 R >> >> >>",
        4: stream(b"", b"BT /F1 12 Tf 72 720 Td (Cycle test page) Tj ET /X1 Do"),
        5: form,
        6: FONT,
        7: b"<< /Type /Pages /Parent 2 0 R /Kids [7 0 R] /Count 1 >>",
    }
    with open(path, "wb") as f:
        f.write(pdf_raw(objs))


def pdf_huge_stream(path, mb=300):
    """A content stream that inflates to `mb` MiB (deflated twice: a few KB on disk)."""
    data = b"BT /F1 12 Tf 72 720 Td (bomb) Tj ET\n" + b" " * (mb << 20)
    twice = zlib.compress(zlib.compress(data, 9), 9)
    objs = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        4: stream(b"/Filter [/FlateDecode /FlateDecode]", twice),
        5: FONT,
    }
    with open(path, "wb") as f:
        f.write(pdf_raw(objs))


def pdf_deep_array(path, depth=20000):
    """An object nested `depth` arrays deep (parser recursion)."""
    objs = {
        1: b"<< /Type /Catalog /Pages 2 0 R /Deep " + b"[" * depth + b"]" * depth + b" >>",
        2: b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        3: b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
        4: stream(b"", b"BT /F1 12 Tf 72 720 Td (deep) Tj ET"),
        5: FONT,
    }
    with open(path, "wb") as f:
        f.write(pdf_raw(objs))


# --- main ------------------------------------------------------------------------------------

def load_corpus(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def fixtures(corpus, out):
    os.makedirs(out, exist_ok=True)
    by_id = {d["doc_id"]: d for d in corpus}
    d1 = by_id["doc-00001"]
    p = lambda name: os.path.join(out, name)
    pdf_plain(p("plain.pdf"), d1)
    pdf_two_columns(p("two-columns.pdf"), by_id["doc-00002"], by_id["doc-00003"])
    pdf_table_two_pages(p("table-two-pages.pdf"))
    pdf_scanned(p("scanned.pdf"))
    pdf_encrypted(p("encrypted.pdf"), d1)
    xlsx_rates(p("rates.xlsx"))
    xlsx_titled(p("titled.xlsx"))
    docx_policy(p("policy.docx"))
    normalize_zip(p("policy.docx"))
    pptx_committee(p("committee.pptx"))
    normalize_zip(p("committee.pptx"))
    with open(p("memo.eml"), "wb") as f:
        f.write(bytes(fixed_boundaries(eml_with_pdf(by_id["doc-00031"], by_id["doc-00001"]))))
    csv_rates(p("branches.csv"))
    hostile = os.path.join(out, "hostile")
    os.makedirs(hostile, exist_ok=True)
    h = lambda name: os.path.join(hostile, name)
    docx_zip_bomb(h("zip-bomb.docx"))
    docx_deep_nested(h("deep-nested.docx"))
    docx_many_entries(h("many-entries.docx"))
    xlsx_billion_laughs(p("rates.xlsx"), h("billion-laughs.xlsx"))
    pdf_xobject_cycle(h("xobject-cycle.pdf"))
    pdf_huge_stream(h("huge-stream.pdf"))
    pdf_deep_array(h("deep-array.pdf"))
    with open(h("deep-nested.eml"), "wb") as f:
        f.write(bytes(fixed_boundaries(eml_deep(12))))
    with open(p("plain.pdf"), "rb") as f:
        data = f.read()
    with open(h("truncated.pdf"), "wb") as f:
        f.write(data[: len(data) // 3])
    total = sum(os.path.getsize(os.path.join(dp, n)) for dp, _, ns in os.walk(out) for n in ns)
    print(f"fixtures in {out}: {total} bytes")


def convert_corpus(corpus, out):
    os.makedirs(out, exist_ok=True)
    fmts = ["pdf", "docx", "xlsx", "pptx", "eml"]
    # A dot name, so `airlock ingest OUT` (which skips hidden files) reads the documents only.
    with open(os.path.join(out, ".manifest.jsonl"), "w") as man:
        for i, doc in enumerate(corpus):
            fmt = fmts[i % len(fmts)]
            name = f"{doc['doc_id']}.{fmt}"
            path = os.path.join(out, name)
            if fmt == "pdf":
                pdf_from_doc_platypus(path, doc)
            elif fmt == "docx":
                docx_from_doc(path, doc)
            elif fmt == "xlsx":
                xlsx_from_doc(path, doc)
            elif fmt == "pptx":
                pptx_from_doc(path, doc)
            else:
                with open(path, "wb") as f:
                    # The whole text: the quality measurement compares like with like.
                    f.write(bytes(eml_with_pdf(doc, None, body_chars=None)))
            man.write(json.dumps({"doc_id": doc["doc_id"], "file": name, "format": fmt,
                                  "title": doc["title"], "metadata": doc["metadata"]}) + "\n")
    print(f"{len(corpus)} documents converted into {out}")


def bench_pdf(corpus, path, pages, first=0):
    """A long PDF (about `pages` pages) of corpus documents one after another, from the
    `first`-th (so that several bench files differ)."""
    c = canvas.Canvas(path, pagesize=A4, invariant=1)
    w, h = A4
    state = {"n": 1}

    def new_page():
        c.showPage()
        state["n"] += 1
        return 20 * mm, h - 25 * mm

    x, y = 20 * mm, h - 25 * mm
    for doc in corpus[first:] + corpus[:first]:
        if state["n"] > pages:
            break
        x, y = draw_blocks(c, [("heading", doc["title"])] + blocks_of(doc["text"]), x, y,
                           w - 40 * mm, 20 * mm, h, new_page)
    c.save()
    print(f"{path}: {state['n']} pages")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--convert-corpus", metavar="DIR")
    ap.add_argument("--bench-pdf", metavar="FILE")
    ap.add_argument("--pages", type=int, default=200)
    ap.add_argument("--first-doc", type=int, default=0,
                    help="with --bench-pdf: start at this corpus document")
    a = ap.parse_args()
    corpus = load_corpus(a.corpus)
    if a.convert_corpus:
        convert_corpus(corpus, a.convert_corpus)
    elif a.bench_pdf:
        bench_pdf(corpus, a.bench_pdf, a.pages, a.first_doc)
    else:
        fixtures(corpus, a.out)


if __name__ == "__main__":
    sys.exit(main())
