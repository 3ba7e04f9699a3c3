//! Parsing and validation of a JSON Lines IAM snapshot (API.md, `POST /v1/acl/sync`).
//!
//! Each non-blank line is exactly one of
//! `{"user": "u001", "groups": [...]}` or `{"doc": "doc-17", "users": [...], "groups": [...]}`;
//! every field is required, unknown fields are rejected, and a user or document named on two
//! lines is rejected. The whole input is validated before anything is applied; errors carry the
//! 1-based line number.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::io::Read;
use std::ops::Deref;

use rayon::prelude::*;
use serde::Deserialize;

use crate::error::{Error, IdKind, LineError, check_id};

/// How many line errors are reported in [`Error::Snapshot`] (the total is counted).
pub const MAX_REPORTED_LINE_ERRORS: usize = 20;

/// An id borrowed from the input when it has no JSON escapes, owned otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Str<'a>(Cow<'a, str>);

impl Deref for Str<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Str<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Str<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A document line: `(doc, users, groups)`.
pub(crate) type DocLine<'a> = (Str<'a>, Vec<Str<'a>>, Vec<Str<'a>>);

/// A validated snapshot, borrowing from the input buffer.
#[derive(Debug, Default)]
pub(crate) struct Snapshot<'a> {
    /// `(user, groups)` in file order.
    pub users: Vec<(Str<'a>, Vec<Str<'a>>)>,
    /// Document lines in file order.
    pub docs: Vec<DocLine<'a>>,
}

/// One line as written; the shape check (user line vs doc line) happens after parsing so the
/// error names the line's actual problem.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine<'a> {
    #[serde(borrow)]
    user: Option<Str<'a>>,
    #[serde(borrow)]
    doc: Option<Str<'a>>,
    #[serde(borrow)]
    users: Option<Vec<Str<'a>>>,
    #[serde(borrow)]
    groups: Option<Vec<Str<'a>>>,
}

fn check_all(kind: IdKind, ids: &[Str<'_>]) -> Result<(), String> {
    for id in ids {
        check_id(kind, id).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Reads the whole input (the HTTP body is bounded by the daemon's 32 MiB limit).
pub(crate) fn read_all(mut input: impl Read) -> Result<Vec<u8>, Error> {
    let mut buf = Vec::new();
    input
        .read_to_end(&mut buf)
        .map_err(|source| Error::SnapshotRead {
            line: buf.iter().filter(|&&b| b == b'\n').count() + 1,
            source,
        })?;
    Ok(buf)
}

/// Validates the whole snapshot (lines are parsed in parallel, duplicates checked in order).
/// Nothing is returned unless every line is valid.
pub(crate) fn parse(input: &[u8]) -> Result<Snapshot<'_>, Error> {
    let lines: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    let parsed: Vec<Result<Option<Line<'_>>, String>> =
        lines.par_iter().map(|raw| parse_line(raw)).collect();
    let mut snap = Snapshot::default();
    let mut seen_users: HashMap<Cow<'_, str>, usize> = HashMap::new();
    let mut seen_docs: HashMap<Cow<'_, str>, usize> = HashMap::new();
    let mut errors = Vec::new();
    let mut total = 0usize;
    let mut fail = |line: usize, message: String| {
        total += 1;
        if errors.len() < MAX_REPORTED_LINE_ERRORS {
            errors.push(LineError { line, message });
        }
    };
    for (i, r) in parsed.into_iter().enumerate() {
        let line_no = i + 1;
        match r {
            Ok(None) => {}
            Err(message) => fail(line_no, message),
            Ok(Some(Line::User(u, g))) => match first_seen(&mut seen_users, &u, line_no) {
                Some(first) => fail(
                    line_no,
                    format!("duplicate user {:?} (first on line {first})", &*u),
                ),
                None => snap.users.push((u, g)),
            },
            Ok(Some(Line::Doc(d, u, g))) => match first_seen(&mut seen_docs, &d, line_no) {
                Some(first) => fail(
                    line_no,
                    format!("duplicate document {:?} (first on line {first})", &*d),
                ),
                None => snap.docs.push((d, u, g)),
            },
        }
    }
    if total > 0 {
        return Err(Error::Snapshot { errors, total });
    }
    Ok(snap)
}

/// Records `id` at `line`; returns the earlier line if it was seen before. Keys borrow from
/// the input unless the id had JSON escapes.
fn first_seen<'a>(
    seen: &mut HashMap<Cow<'a, str>, usize>,
    id: &Str<'a>,
    line: usize,
) -> Option<usize> {
    match seen.entry(id.0.clone()) {
        Entry::Occupied(o) => Some(*o.get()),
        Entry::Vacant(v) => {
            v.insert(line);
            None
        }
    }
}

enum Line<'a> {
    User(Str<'a>, Vec<Str<'a>>),
    Doc(Str<'a>, Vec<Str<'a>>, Vec<Str<'a>>),
}

fn parse_line(raw: &[u8]) -> Result<Option<Line<'_>>, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "not valid UTF-8".to_owned())?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let line: RawLine<'_> = serde_json::from_str(text).map_err(|e| {
        // serde_json's message ends with "at line 1 column N": keep only the column.
        let msg = e.to_string();
        match msg.rfind(" at line ") {
            Some(i) => format!("{} (column {})", &msg[..i], e.column()),
            None => msg,
        }
    })?;
    match line {
        RawLine {
            user: Some(user),
            doc: None,
            users: None,
            groups: Some(groups),
        } => {
            check_id(IdKind::User, &user).map_err(|e| e.to_string())?;
            check_all(IdKind::Group, &groups)?;
            Ok(Some(Line::User(user, groups)))
        }
        RawLine {
            user: None,
            doc: Some(doc),
            users: Some(users),
            groups: Some(groups),
        } => {
            check_id(IdKind::Document, &doc).map_err(|e| e.to_string())?;
            check_all(IdKind::User, &users)?;
            check_all(IdKind::Group, &groups)?;
            Ok(Some(Line::Doc(doc, users, groups)))
        }
        RawLine {
            user: Some(_),
            doc: Some(_),
            ..
        } => Err("a line has either `user` or `doc`, not both".to_owned()),
        RawLine {
            user: Some(_),
            users: Some(_),
            ..
        } => Err("unknown field `users` in a user line".to_owned()),
        RawLine { user: Some(_), .. } => Err("missing field `groups` in a user line".to_owned()),
        RawLine {
            doc: Some(_),
            users: None,
            ..
        } => Err("missing field `users` in a document line".to_owned()),
        RawLine { doc: Some(_), .. } => Err("missing field `groups` in a document line".to_owned()),
        RawLine {
            user: None,
            doc: None,
            ..
        } => Err("a line needs `user` or `doc`".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errs(input: &str) -> Vec<LineError> {
        match parse(input.as_bytes()) {
            Err(Error::Snapshot { errors, .. }) => errors,
            other => panic!("expected a snapshot error, got {other:?}"),
        }
    }

    #[test]
    fn parses_both_line_kinds_and_skips_blank_lines() {
        let s = parse(
            "{\"user\": \"u1\", \"groups\": [\"risk\"]}\r\n\n{\"doc\": \"d1\", \"users\": [], \"groups\": []}"
                .as_bytes(),
        )
        .unwrap();
        let id = |x: &'static str| Str(Cow::Borrowed(x));
        assert_eq!(s.users, vec![(id("u1"), vec![id("risk")])]);
        assert_eq!(s.docs, vec![(id("d1"), vec![], vec![])]);
        assert!(
            matches!(s.users[0].0.0, Cow::Borrowed(_)),
            "unescaped ids are borrowed"
        );
        let buf = br#"{"user": "caf\u00e9", "groups": []}"#.to_vec();
        let s = parse(&buf).unwrap();
        assert_eq!(&*s.users[0].0, "caf\u{e9}");
    }

    #[test]
    fn every_bad_line_is_named() {
        let input = [
            r#"{"user": "u1", "groups": []}"#,
            r#"{"user": "u2", "groups": [], "role": "admin"}"#,
            r#"{"doc": "d1", "users": []}"#,
            r#"not json"#,
            r#"{"user": "u1", "groups": ["x"]}"#,
            r#"{"doc": "d1", "users": [], "groups": []}"#,
            r#"{"doc": "d1", "users": [], "groups": []}"#,
            r#"{"user": "u3", "users": [], "groups": []}"#,
            r#"{"user": "", "groups": []}"#,
            r#"{"groups": []}"#,
            r#"{"user": "u4", "doc": "d4", "groups": []}"#,
            r#"{"user": "u5", "groups": "risk"}"#,
        ]
        .join("\n");
        let e = errs(&input);
        let lines: Vec<usize> = e.iter().map(|l| l.line).collect();
        assert_eq!(lines, [2, 3, 4, 5, 7, 8, 9, 10, 11, 12]);
        assert!(e[0].message.contains("unknown field `role`"), "{}", e[0]);
        assert!(e[1].message.contains("missing field `groups`"), "{}", e[1]);
        assert!(
            e[3].message
                .contains("duplicate user \"u1\" (first on line 1)")
        );
        assert!(
            e[4].message
                .contains("duplicate document \"d1\" (first on line 6)")
        );
        assert!(e[5].message.contains("unknown field `users`"));
        assert!(e[6].message.contains("invalid user id"));
    }

    #[test]
    fn invalid_utf8_is_a_line_error() {
        let mut input = b"{\"user\": \"u1\", \"groups\": []}\n".to_vec();
        input.extend_from_slice(b"{\"user\": \"\xff\", \"groups\": []}\n");
        match parse(&input[..]) {
            Err(Error::Snapshot { errors, total: 1 }) => {
                assert_eq!(errors[0].line, 2);
                assert!(errors[0].message.contains("UTF-8"));
            }
            other => panic!("{other:?}"),
        }
    }
}
