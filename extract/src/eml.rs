//! E-mail (RFC 5322 / MIME) through `mail-parser`: subject (the title and the section), the
//! From/To/Cc/Date line, the body (plain text, else HTML rendered), then every attachment
//! extracted in turn within the limits, under the section path [subject, file name].

use mail_parser::{Message, MessageParser, MessagePart, MimeHeaders};

use crate::html::html_to_text;
use crate::limits::Budget;
use crate::text::push_markdown;
use crate::{Anchor, Block, BlockKind, Extracted, Format, Limits, Refusal, extract_with};

pub(crate) fn extract(
    bytes: &[u8],
    limits: &Limits,
    budget: &mut Budget,
    depth: u32,
) -> Result<Extracted, Refusal> {
    // mail-parser 0.11 panics on some malformed nested multiparts ("Invalid part ID, could not
    // find multipart", found by the extract_eml fuzz target; regression input in
    // fuzz/regressions/extract_eml/): contained here and refused as malformed.
    let parsed = std::panic::catch_unwind(|| MessageParser::default().parse(bytes));
    let msg = match parsed {
        Ok(Some(m)) => m,
        Ok(None) => return Err(Refusal::malformed(Format::Eml, "no message headers found")),
        Err(_) => {
            return Err(Refusal::malformed(
                Format::Eml,
                "MIME structure could not be parsed",
            ));
        }
    };
    let mut out = Extracted::default();
    message(&msg, limits, budget, depth, &[], &mut out)?;
    out.units = 1;
    Ok(out)
}

fn addresses(a: Option<&mail_parser::Address<'_>>) -> Option<String> {
    let list: Vec<String> = a?
        .iter()
        .map(|x| match (x.name(), x.address()) {
            (Some(n), Some(ad)) => format!("{n} <{ad}>"),
            (None, Some(ad)) => ad.to_owned(),
            (Some(n), None) => n.to_owned(),
            (None, None) => String::new(),
        })
        .filter(|s| !s.is_empty())
        .collect();
    (!list.is_empty()).then(|| list.join(", "))
}

fn message(
    msg: &Message<'_>,
    limits: &Limits,
    budget: &mut Budget,
    depth: u32,
    base: &[String],
    out: &mut Extracted,
) -> Result<(), Refusal> {
    let subject = msg.subject().map(str::trim).filter(|s| !s.is_empty());
    if out.title.is_none() {
        out.title = subject.map(str::to_owned);
    }
    let mut section = base.to_vec();
    section.push(subject.unwrap_or("(no subject)").to_owned());
    let anchor = Anchor {
        section: section.clone(),
        ..Anchor::default()
    };
    budget.push(
        &mut out.blocks,
        Block {
            kind: BlockKind::Heading(1),
            text: section.last().cloned().unwrap_or_default(),
            anchor: anchor.clone(),
        },
    )?;
    let head = header_lines(msg);
    if !head.is_empty() {
        budget.push(
            &mut out.blocks,
            Block {
                kind: BlockKind::Paragraph,
                text: head.join("\n"),
                anchor: anchor.clone(),
            },
        )?;
    }
    let body = body_text(msg, limits)?;
    push_markdown(&body, &anchor, budget, &mut out.blocks)?;
    for (i, part) in msg.attachments().enumerate() {
        if i as u64 >= u64::from(limits.max_attachments) {
            return Err(Refusal::limit(
                "max_attachments",
                msg.attachment_count(),
                limits.max_attachments,
            ));
        }
        if depth + 1 > limits.max_attachment_depth {
            return Err(Refusal::limit(
                "max_attachment_depth",
                depth + 1,
                limits.max_attachment_depth,
            ));
        }
        attachment(part, i, limits, budget, depth, &section, out)?;
    }
    Ok(())
}

/// The From/To/Cc/Date lines the message has.
fn header_lines(msg: &Message<'_>) -> Vec<String> {
    let mut head = Vec::new();
    for (label, v) in [
        ("From", addresses(msg.from())),
        ("To", addresses(msg.to())),
        ("Cc", addresses(msg.cc())),
        ("Date", msg.date().map(|d| d.to_rfc3339())),
    ] {
        if let Some(v) = v {
            head.push(format!("{label}: {v}"));
        }
    }
    head
}

/// The body: the first text part when it is plain and not blank, else the HTML one rendered.
fn body_text(msg: &Message<'_>, limits: &Limits) -> Result<String, Refusal> {
    Ok(match msg.body_text(0) {
        Some(t)
            if !t.trim().is_empty()
                && msg.text_body_count() > 0
                && !msg.text_part(0).is_some_and(|p| p.is_text_html()) =>
        {
            t.into_owned()
        }
        _ => match msg.body_html(0) {
            Some(h) => html_to_text(h.as_bytes(), limits)?,
            None => String::new(),
        },
    })
}

/// Attachment `i` of a message at `depth` whose section is `section`: a message inside read as
/// one, a file of a known format extracted under [section, name], else a note saying why not.
fn attachment(
    part: &MessagePart<'_>,
    i: usize,
    limits: &Limits,
    budget: &mut Budget,
    depth: u32,
    section: &[String],
    out: &mut Extracted,
) -> Result<(), Refusal> {
    let name = part
        .attachment_name()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("attachment {}", i + 1));
    let mut sub = section.to_vec();
    sub.push(name.clone());
    if let Some(inner) = part.message() {
        return message(inner, limits, budget, depth + 1, section, out);
    }
    let note = |reason: String| Block {
        kind: BlockKind::Paragraph,
        text: format!("[attachment {name} not extracted: {reason}]"),
        anchor: Anchor {
            section: sub.clone(),
            ..Anchor::default()
        },
    };
    let Some(format) = attachment_format(part, &name) else {
        return budget.push(&mut out.blocks, note("unsupported format".into()));
    };
    match extract_with(part.contents(), format, limits, budget, depth + 1) {
        Ok(x) => {
            for mut b in x.blocks {
                let mut path = sub.clone();
                path.append(&mut b.anchor.section);
                b.anchor.section = path;
                out.blocks.push(b);
            }
        }
        // A bomb inside an attachment refuses the whole message.
        Err(e @ Refusal::LimitExceeded { .. }) => return Err(e),
        Err(e) => budget.push(&mut out.blocks, note(e.to_string()))?,
    }
    Ok(())
}

/// An attachment's format: a message for `message/rfc822`, else by its file name's extension,
/// else by its media type.
fn attachment_format(part: &MessagePart<'_>, name: &str) -> Option<Format> {
    let is_rfc822 = part.content_type().is_some_and(|c| {
        c.ctype().eq_ignore_ascii_case("message")
            && c.subtype()
                .is_some_and(|s| s.eq_ignore_ascii_case("rfc822"))
    });
    let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    if is_rfc822 {
        Some(Format::Eml)
    } else {
        Format::from_extension(ext).or_else(|| {
            part.content_type().and_then(|c| {
                let mt = format!("{}/{}", c.ctype(), c.subtype().unwrap_or(""));
                Format::from_media_type(&mt)
            })
        })
    }
}
