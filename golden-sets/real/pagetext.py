"""Plain text of a corpus page, for the set checker and for writing questions.

HTML: the standard library's HTMLParser; `script`/`style` dropped, block elements end a line,
entities decoded. PDF: `pdftotext` (reading order, not -layout) (poppler-utils). This is not the appliance's
extractor (extract/); it is a simple, independent reading of the same files.
"""
import html.parser
import re
import subprocess
import sys

BLOCK = {
    "p", "div", "br", "li", "tr", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6", "pre",
    "dt", "dd", "table", "section", "blockquote", "ul", "ol", "dl", "title", "hr",
}


class _Text(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        elif tag in BLOCK:
            self.out.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        elif tag in BLOCK:
            self.out.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.out.append(data)


def html_text(raw: bytes) -> str:
    p = _Text()
    p.feed(raw.decode("utf-8", errors="replace"))
    p.close()
    return "".join(p.out)


def pdf_text(path: str) -> str:
    return subprocess.run(
        ["pdftotext", "-enc", "UTF-8", path, "-"],
        check=True, capture_output=True,
    ).stdout.decode("utf-8", errors="replace")


def page_text(path: str) -> str:
    if path.endswith(".pdf"):
        return pdf_text(path)
    with open(path, "rb") as f:
        return html_text(f.read())


def flat(text: str) -> str:
    """Whitespace runs (including line breaks and soft hyphen joins) as one space."""
    return re.sub(r"\s+", " ", text.replace("\u00ad", "")).strip()


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(page_text(p))
