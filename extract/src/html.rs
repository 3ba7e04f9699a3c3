//! HTML to text (`html2text` over html5ever), behind a nesting guard.
//!
//! html5ever's tree builder checks "is a `p` in button scope" and the like on most start tags
//! by walking the stack of open elements, so its cost is the number of tags times the nesting
//! depth: 200,000 nested `<div>`s take minutes. [`nesting_depth`] estimates the depth the tree
//! builder will reach in one linear pass over the bytes, keeping a stack of open elements never
//! deeper than the limit, so the tree builder never sees a document deeper than
//! `max_html_depth` (browsers stop nesting at 512 too).

use crate::{Format, Limits, Refusal};

/// Renders HTML to text with `#` headings, within `max_html_depth`.
pub fn html_to_text(bytes: &[u8], limits: &Limits) -> Result<String, Refusal> {
    let depth = nesting_depth(bytes, limits.max_html_depth);
    if depth > limits.max_html_depth {
        return Err(Refusal::limit(
            "max_html_depth",
            depth,
            limits.max_html_depth,
        ));
    }
    let config = html2text::config::plain_no_decorate().no_table_borders();
    let malformed = |e| Refusal::malformed(Format::Html, e);
    let dom = config.parse_html(bytes).map_err(malformed)?;
    strip_chrome(&dom.document);
    let tree = config.dom_to_render_tree(&dom).map_err(malformed)?;
    config
        .render_to_string(tree, 100_000)
        .map(|t| t.lines().map(str::trim_end).collect::<Vec<_>>().join("\n"))
        .map_err(malformed)
}

/// `class` or `id` words that mark a site's navigation chrome in the documentation generators
/// Debian ships (DocBook XSL `navheader`/`navfooter`, Publican `docnav` and its `banner`,
/// Sphinx `related`/`sphinxsidebar`/`footer`) and in common site templates. Whole words only,
/// compared without case: DocBook's `sidebar` (a boxed note in the text) is content and is
/// not among them.
const CHROME_WORDS: &[&str] = &[
    "banner",
    "breadcrumb",
    "breadcrumbs",
    "docnav",
    "footer",
    "navbar",
    "navfooter",
    "navheader",
    "navigation",
    "related",
    "sphinxsidebar",
];

/// ARIA landmark roles of chrome: navigation, the site banner, search, the page footer.
const CHROME_ROLES: &[&str] = &["navigation", "banner", "search", "contentinfo"];

/// Whether an element is page chrome, from its own markup alone: a `nav` element, a chrome
/// landmark role, or a chrome word as a whole `class` or `id` token.
fn is_chrome(tag: &str, attrs: &[(&str, &str)]) -> bool {
    if tag.eq_ignore_ascii_case("nav") {
        return true;
    }
    attrs.iter().any(|&(name, value)| match name {
        "role" => CHROME_ROLES
            .iter()
            .any(|r| value.trim().eq_ignore_ascii_case(r)),
        "class" | "id" => value
            .split_ascii_whitespace()
            .any(|w| CHROME_WORDS.iter().any(|c| w.eq_ignore_ascii_case(c))),
        _ => false,
    })
}

/// Removes a page's navigation chrome (prev/next/up/home bars, breadcrumbs, site banners,
/// sidebars of links, footers: [`is_chrome`]) and the images inside links (logos whose alt
/// text would read "[Product Site]"), so that they reach neither chunks nor snippets.
///
/// Decided per element from the page's own markup, never from other documents: a rule that
/// counted lines repeated across pages would make one document's chunks depend on which
/// other documents (perhaps ones the reader may not see) hold the same line.
fn strip_chrome(root: &html2text::Handle) {
    // Iterative, so nesting cannot grow the call stack (the depth is bounded before parsing).
    let mut stack = vec![(root.clone(), false)];
    while let Some((node, in_link)) = stack.pop() {
        let mut children = node.children.borrow_mut();
        children.retain(|child| match &child.data {
            html2text::Element { name, attrs, .. } => {
                let tag: &str = &name.local;
                if in_link && tag.eq_ignore_ascii_case("img") {
                    return false;
                }
                let attrs = attrs.borrow();
                let pairs: Vec<(&str, &str)> =
                    attrs.iter().map(|a| (&*a.name.local, &*a.value)).collect();
                !is_chrome(tag, &pairs)
            }
            _ => true,
        });
        for child in children.iter() {
            if let html2text::Element { name, .. } = &child.data {
                let tag: &str = &name.local;
                let link = in_link || tag.eq_ignore_ascii_case("a");
                stack.push((child.clone(), link));
            }
        }
    }
}

/// Elements that never have content.
const VOID: &[&[u8]] = &[
    b"area",
    b"base",
    b"br",
    b"col",
    b"embed",
    b"hr",
    b"img",
    b"input",
    b"keygen",
    b"link",
    b"meta",
    b"param",
    b"source",
    b"track",
    b"wbr",
    b"basefont",
    b"bgsound",
    b"frame",
];

/// Start tags that close an open `p` (HTML's "close a p element").
const CLOSES_P: &[&[u8]] = &[
    b"address",
    b"article",
    b"aside",
    b"blockquote",
    b"center",
    b"details",
    b"dialog",
    b"dir",
    b"div",
    b"dl",
    b"fieldset",
    b"figcaption",
    b"figure",
    b"footer",
    b"form",
    b"h1",
    b"h2",
    b"h3",
    b"h4",
    b"h5",
    b"h6",
    b"header",
    b"hgroup",
    b"hr",
    b"li",
    b"listing",
    b"main",
    b"menu",
    b"nav",
    b"ol",
    b"p",
    b"plaintext",
    b"pre",
    b"search",
    b"section",
    b"summary",
    b"table",
    b"ul",
    b"dd",
    b"dt",
    b"xmp",
];

/// Elements whose content is text up to their end tag.
const RAW: &[&[u8]] = &[
    b"script",
    b"style",
    b"textarea",
    b"title",
    b"xmp",
    b"iframe",
    b"noembed",
    b"noframes",
];

/// Elements that bound the search for an element to close implicitly (a `p` inside a table
/// cell is not closed by a `div` outside it).
const SCOPE: &[&[u8]] = &[
    b"html",
    b"table",
    b"td",
    b"th",
    b"caption",
    b"button",
    b"template",
    b"applet",
    b"marquee",
    b"object",
];

/// The deepest nesting of elements the HTML tree builder reaches for `bytes`, estimated from
/// the tags alone: void elements and raw text (`script`, `style`, ...) are honoured, an end tag
/// closes up to its element, and the end tags HTML implies are applied (a `p` closed by the
/// next block, `li` by `li`, `dd`/`dt`, table rows and cells, `option`). It stops counting once
/// the depth passes `cap`, so it is linear in the input. Sloppy markup may be estimated deeper
/// than it parses, never much shallower.
pub(crate) fn nesting_depth(bytes: &[u8], cap: u32) -> u32 {
    let mut stack: Vec<Vec<u8>> = Vec::new();
    let mut deepest = 0u32;
    let mut foreign = 0u32; // open svg/math elements: `/>` closes there
    let n = bytes.len();
    let mut i = 0;
    while i < n {
        let Some(lt) = bytes[i..].iter().position(|&b| b == b'<') else {
            break;
        };
        i += lt + 1;
        if bytes[i..].starts_with(b"!--") {
            i = find(bytes, i + 3, b"-->").map_or(n, |j| j + 3);
            continue;
        }
        if matches!(bytes.get(i), Some(b'!' | b'?')) {
            i = bytes[i..]
                .iter()
                .position(|&b| b == b'>')
                .map_or(n, |j| i + j + 1);
            continue;
        }
        let end = bytes.get(i) == Some(&b'/');
        if end {
            i += 1;
        }
        let start = i;
        while i < n && bytes[i].is_ascii_alphanumeric() {
            i += 1;
        }
        if i == start || !bytes[start].is_ascii_alphabetic() {
            continue; // not a tag: text
        }
        let name = bytes[start..i].to_ascii_lowercase();
        // The rest of the tag: attributes, quoted values may hold `>`.
        let mut quote = None;
        let mut self_closing = false;
        while i < n {
            let b = bytes[i];
            i += 1;
            match (quote, b) {
                (Some(q), _) if b == q => quote = None,
                (Some(_), _) => {}
                (None, b'"' | b'\'') => quote = Some(b),
                (None, b'>') => {
                    self_closing = bytes[..i - 1].last() == Some(&b'/');
                    break;
                }
                _ => {}
            }
        }
        if end {
            if let Some(at) = stack.iter().rposition(|e| *e == name) {
                for e in stack.drain(at..) {
                    if e == b"svg" || e == b"math" {
                        foreign = foreign.saturating_sub(1);
                    }
                }
            }
            continue;
        }
        let is = |set: &[&[u8]]| set.contains(&name.as_slice());
        if is(CLOSES_P) {
            close(&mut stack, &[b"p"]);
        }
        match name.as_slice() {
            b"li" => close(&mut stack, &[b"li"]),
            b"dd" | b"dt" => close(&mut stack, &[b"dd", b"dt"]),
            b"tr" => close(&mut stack, &[b"tr"]),
            b"td" | b"th" => close(&mut stack, &[b"td", b"th"]),
            b"tbody" | b"thead" | b"tfoot" => close(&mut stack, &[b"tbody", b"thead", b"tfoot"]),
            b"option" | b"optgroup" => close(&mut stack, &[b"option"]),
            b"h1" | b"h2" | b"h3" | b"h4" | b"h5" | b"h6"
                if stack.last().is_some_and(|t| {
                    t.len() == 2 && t[0] == b'h' && (b'1'..=b'6').contains(&t[1])
                }) =>
            {
                stack.pop();
            }
            _ => {}
        }
        if is(VOID) || (self_closing && foreign > 0) {
            continue;
        }
        if is(RAW) {
            // Text up to `</name`; the element opens and closes.
            let mut close_tag = b"</".to_vec();
            close_tag.extend_from_slice(&name);
            i = find_ci(bytes, i, &close_tag).unwrap_or(n);
            deepest = deepest.max(stack.len() as u32 + 1);
            continue;
        }
        if name == b"svg" || name == b"math" {
            foreign += 1;
        }
        stack.push(name);
        deepest = deepest.max(stack.len() as u32);
        if deepest > cap {
            return deepest;
        }
    }
    deepest
}

/// Closes the innermost open element named in `names`, with everything opened inside it,
/// unless a scope boundary comes first.
fn close(stack: &mut Vec<Vec<u8>>, names: &[&[u8]]) {
    for at in (0..stack.len()).rev() {
        let e = stack[at].as_slice();
        if names.contains(&e) {
            stack.truncate(at);
            return;
        }
        if SCOPE.contains(&e) {
            return;
        }
    }
}

fn find(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|j| from + j)
}

fn find_ci(hay: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w.eq_ignore_ascii_case(needle))
        .map(|j| from + j)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_follows_html_rules() {
        assert_eq!(nesting_depth(b"<div><div><p>x</p></div></div>", 512), 3);
        // Unclosed paragraphs and list items do not nest.
        let sloppy = "<ul>".to_owned() + &"<li><p>item".repeat(2000) + "</ul>";
        assert!(nesting_depth(sloppy.as_bytes(), 512) <= 4);
        let table = "<table>".to_owned() + &"<tr><td>a<td>b".repeat(2000) + "</table>";
        assert!(nesting_depth(table.as_bytes(), 512) <= 4);
        // Void elements, self-closed divs (which HTML opens), comments and scripts.
        assert_eq!(nesting_depth(&b"<br><img src='>'>".repeat(1000), 512), 0);
        assert_eq!(nesting_depth(&b"<div/>".repeat(600), 512), 513);
        assert_eq!(
            nesting_depth(
                b"<!-- <div><div> --><script>if (a<b) x('<div>')</script>",
                512
            ),
            1
        );
        assert_eq!(nesting_depth(&b"<svg><g/>".repeat(3), 512), 3);
    }

    #[test]
    fn navigation_chrome_is_left_out_and_content_kept() {
        let render = |html: &str| html_to_text(html.as_bytes(), &Limits::default()).unwrap();
        // Publican (the Debian Administrator's Handbook): banner, logo links, docnav bars; a
        // DocBook `sidebar` is a boxed note of the text and stays.
        let publican = r#"<html><body><div id="banner"><a href="x"><span class="text">Download
            the ebook</span></a></div><p id="title"><a class="left" href="y"><img alt="Product
            Site" src="l.png" /></a></p><ul class="docnav top"><li class="previous"><a
            href="p.html"><strong>Prev</strong></a></li><li class="next"><a href="n.html">
            <strong>Next</strong></a></li></ul><h2>6.2. apt-get</h2><div class="para">Use
            apt-get install --reinstall.</div><div class="sidebar"><p>TIP Keep a backup.</p>
            </div><ul class="docnav"><li class="up"><a href="u.html">Up</a></li></ul>
            </body></html>"#;
        let text = render(publican);
        for chrome in ["Download", "Product", "Prev", "Next", "Up"] {
            assert!(!text.contains(chrome), "{chrome} in {text:?}");
        }
        assert!(text.starts_with("## 6.2. apt-get"), "{text:?}");
        assert!(text.contains("--reinstall") && text.contains("TIP Keep a backup."));
        // DocBook XSL (navheader table, navfooter) and Sphinx (related bar, sidebar, footer).
        let docbook = r#"<div class="navheader"><table><tr><th>Chapter 19</th></tr><tr><td><a
            href="a.html">Prev</a></td><td><a href="b.html">Next</a></td></tr></table></div>
            <p>The default port is 5432.</p><div class="navfooter"><a href="c.html">Home</a></div>"#;
        assert_eq!(render(docbook), "The default port is 5432.");
        let sphinx = r#"<div class="related" role="navigation"><ul><li>modules</li></ul></div>
            <nav class="menu"><a href="i.html">index</a></nav><div class="body"><p>traceback
            prints a stack trace.</p></div><div class="sphinxsidebar" role="navigation"><p>This
            page</p></div><div class="footer">&copy; Copyright 2001</div>"#;
        assert_eq!(render(sphinx), "traceback prints a stack trace.");
        // Words inside a class are whole tokens: "navigation-help" content is not chrome.
        assert_eq!(
            render(r#"<div class="navigation-help"><p>Press n for next.</p></div>"#),
            "Press n for next."
        );
    }

    #[test]
    fn deep_nesting_is_refused_before_the_tree_builder_runs() {
        let deep = "<div>".repeat(200_000) + "text";
        let r = html_to_text(deep.as_bytes(), &Limits::default()).unwrap_err();
        assert_eq!(r.to_string(), "limit exceeded: max_html_depth (513 > 512)");
        let ok = "<div>".repeat(100) + "deep text";
        assert_eq!(
            html_to_text(ok.as_bytes(), &Limits::default()).unwrap(),
            "deep text"
        );
    }
}
