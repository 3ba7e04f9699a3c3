//! Parsing and validation of a JSON Lines IAM snapshot (API.md, `POST /v1/acl/sync`).
//!
//! Each non-blank line is exactly one of
//! `{"user": "u001", "groups": [...]}` or `{"doc": "doc-17", "users": [...], "groups": [...]}`;
//! every field is required, unknown fields are rejected, and a user or document named on two
//! lines is rejected. The whole input is validated before anything is applied; errors carry the
//! 1-based line number.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::BufRead;

use serde::Deserialize;

use crate::error::{Error, IdKind, LineError, check_id};

/// How many line errors are reported in [`Error::Snapshot`] (the total is counted).
pub const MAX_REPORTED_LINE_ERRORS: usize = 20;

/// A validated snapshot.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    /// `(user, groups)` in file order.
    pub users: Vec<(String, Vec<String>)>,
    /// `(doc, users, groups)` in file order.
    pub docs: Vec<(String, Vec<String>, Vec<String>)>,
}

/// One line as written; the shape check (user line vs doc line) happens after parsing so the
/// error names the line's actual problem.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine {
    user: Option<String>,
    doc: Option<String>,
    users: Option<Vec<String>>,
    groups: Option<Vec<String>>,
}

fn check_all(kind: IdKind, ids: &[String]) -> Result<(), String> {
    for id in ids {
        check_id(kind, id).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Reads and validates the whole snapshot. Nothing is returned unless every line is valid.
pub(crate) fn parse(mut input: impl BufRead) -> Result<Snapshot, Error> {
    let mut snap = Snapshot::default();
    let mut seen_users: HashMap<String, usize> = HashMap::new();
    let mut seen_docs: HashMap<String, usize> = HashMap::new();
    let mut errors = Vec::new();
    let mut total = 0usize;
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        line_no += 1;
        let n = input
            .read_until(b'\n', &mut buf)
            .map_err(|source| Error::SnapshotRead {
                line: line_no,
                source,
            })?;
        if n == 0 {
            break;
        }
        match parse_line(&buf, line_no, &mut seen_users, &mut seen_docs) {
            Ok(None) => {}
            Ok(Some(Line::User(u, g))) => snap.users.push((u, g)),
            Ok(Some(Line::Doc(d, u, g))) => snap.docs.push((d, u, g)),
            Err(message) => {
                total += 1;
                if errors.len() < MAX_REPORTED_LINE_ERRORS {
                    errors.push(LineError {
                        line: line_no,
                        message,
                    });
                }
            }
        }
    }
    if total > 0 {
        return Err(Error::Snapshot { errors, total });
    }
    Ok(snap)
}

enum Line {
    User(String, Vec<String>),
    Doc(String, Vec<String>, Vec<String>),
}

fn parse_line(
    raw: &[u8],
    line_no: usize,
    seen_users: &mut HashMap<String, usize>,
    seen_docs: &mut HashMap<String, usize>,
) -> Result<Option<Line>, String> {
    let text = std::str::from_utf8(raw).map_err(|_| "not valid UTF-8".to_owned())?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let line: RawLine = serde_json::from_str(text).map_err(|e| {
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
            match seen_users.entry(user) {
                Entry::Occupied(o) => Err(format!(
                    "duplicate user {:?} (first on line {})",
                    o.key(),
                    o.get()
                )),
                Entry::Vacant(v) => {
                    let user = v.key().clone();
                    v.insert(line_no);
                    Ok(Some(Line::User(user, groups)))
                }
            }
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
            match seen_docs.entry(doc) {
                Entry::Occupied(o) => Err(format!(
                    "duplicate document {:?} (first on line {})",
                    o.key(),
                    o.get()
                )),
                Entry::Vacant(v) => {
                    let doc = v.key().clone();
                    v.insert(line_no);
                    Ok(Some(Line::Doc(doc, users, groups)))
                }
            }
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
        assert_eq!(s.users, vec![("u1".into(), vec!["risk".into()])]);
        assert_eq!(s.docs, vec![("d1".into(), vec![], vec![])]);
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
