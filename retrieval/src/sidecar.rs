//! The permissions sidecar of a folder ingest (`airlock ingest DIR`): `DIR/.acl.jsonl`, one rule
//! per line, `{"path": GLOB, "users": [...], "groups": [...]}`, mapping files (by their path
//! relative to `DIR`, `/`-separated) to the grant stored with their document.
//!
//! Globs: `*` is any run of characters within one path segment, `?` one character other than
//! `/`, `**` as a whole segment any number of segments (also none); everything else is literal
//! and the whole path must match. When several rules match a file, the **last** one wins (as
//! in `.gitignore`): put broad rules first and exceptions after them. A file no rule matches
//! keeps its current grant (nobody's, for a new document).
//!
//! Case: a share exported from a case-insensitive file system (SMB, NTFS) may spell a folder
//! `HR/` where the sidecar says `hr/**`. [`GlobCase`] says how globs treat case; by default
//! ([`GlobCase::Refuse`]) a file whose rule would differ between exact and case-insensitive
//! matching gets no rule and is refused by the ingest, since either guess can give it a broader
//! grant than its folder's.
//!
//! The whole file is checked before anything is written: a bad line is an error naming the
//! file and the line.

use airlock_acl::DocGrants;
use serde::Deserialize;

use crate::error::{Error, Result};

/// The sidecar's file name in the ingested folder.
pub const SIDECAR_NAME: &str = ".acl.jsonl";
/// Largest sidecar file, bytes.
pub const MAX_SIDECAR_BYTES: usize = 8 << 20;
/// Most rules in a sidecar.
pub const MAX_SIDECAR_RULES: usize = 10_000;
/// Longest glob, bytes.
pub const MAX_GLOB_BYTES: usize = 1024;
/// Most `*` and `**` in one glob (bounds the matcher's backtracking).
pub const MAX_GLOB_STARS: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    path: String,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    groups: Vec<String>,
}

/// How sidecar globs treat case (`sidecar_glob_case` in the config file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GlobCase {
    /// Match exactly, and refuse a file whose rule would differ under case-insensitive
    /// matching (the default: the appliance cannot tell how the share compared names).
    #[default]
    Refuse,
    /// Match exactly (a case-sensitive share: `HR/` and `hr/` are different folders).
    Sensitive,
    /// Match ignoring case (a case-insensitive share: SMB, NTFS).
    Insensitive,
}

/// A file whose rule depends on case ([`GlobCase::Refuse`]): the line of the rule exact
/// matching chooses and of the one case-insensitive matching chooses (`None`: no rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaseDependent {
    /// The rule matched exactly.
    pub exact: Option<usize>,
    /// The rule matched ignoring case.
    pub folded: Option<usize>,
}

impl std::fmt::Display for CaseDependent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = |l: Option<usize>| l.map_or("no rule".to_string(), |l| format!("line {l}"));
        write!(
            f,
            "its sidecar rule depends on case ({} matching exactly, {} ignoring case); set \
             `sidecar_glob_case` to \"sensitive\" or \"insensitive\" for this share",
            line(self.exact),
            line(self.folded)
        )
    }
}

/// One rule of a sidecar.
#[derive(Debug, Clone, PartialEq)]
pub struct AclRule {
    /// The glob, as written.
    pub glob: String,
    /// The grant of the files it matches.
    pub grants: DocGrants,
    /// Its 1-based line number.
    pub line: usize,
}

/// A parsed sidecar.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sidecar {
    /// The rules, in file order.
    pub rules: Vec<AclRule>,
}

impl Sidecar {
    /// Parses a sidecar; `source_name` names the file in errors. Blank lines and lines starting
    /// with `#` are skipped.
    pub fn parse(source_name: &str, bytes: &[u8]) -> Result<Self> {
        let bad = |line: usize, reason: String| Error::InvalidJsonl {
            source_name: source_name.to_owned(),
            line,
            reason,
        };
        if bytes.len() > MAX_SIDECAR_BYTES {
            return Err(bad(
                0,
                format!(
                    "the sidecar has {} bytes, more than the limit of {MAX_SIDECAR_BYTES}",
                    bytes.len()
                ),
            ));
        }
        let mut rules = Vec::new();
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let n = i + 1;
            let text = std::str::from_utf8(raw)
                .map_err(|e| bad(n, format!("not UTF-8 at byte {}", e.valid_up_to())))?;
            let text = text.trim();
            if text.is_empty() || text.starts_with('#') {
                continue;
            }
            if rules.len() == MAX_SIDECAR_RULES {
                return Err(bad(
                    n,
                    format!("more than {MAX_SIDECAR_RULES} rules in one sidecar"),
                ));
            }
            let l: Line = serde_json::from_str(text).map_err(|e| {
                bad(
                    n,
                    format!(
                        "expected {{\"path\": GLOB, \"users\": [...], \"groups\": [...]}}: {e}"
                    ),
                )
            })?;
            check_glob(&l.path).map_err(|r| bad(n, r))?;
            let grants = DocGrants {
                users: l.users,
                groups: l.groups,
            };
            grants
                .validate("sidecar")
                .map_err(|e| bad(n, e.to_string()))?;
            rules.push(AclRule {
                glob: l.path,
                grants,
                line: n,
            });
        }
        Ok(Self { rules })
    }

    /// The rule for the file at `rel_path` (relative, `/`-separated): the last matching one,
    /// matching exactly.
    pub fn rule_for(&self, rel_path: &str) -> Option<&AclRule> {
        self.rules
            .iter()
            .rev()
            .find(|r| glob_match(&r.glob, rel_path))
    }

    /// The rule for the file at `rel_path` with globs matching as `case` says. Under
    /// [`GlobCase::Refuse`], a file whose grant would differ between exact and case-insensitive
    /// matching is an error.
    pub fn rule_with(
        &self,
        rel_path: &str,
        case: GlobCase,
    ) -> std::result::Result<Option<&AclRule>, CaseDependent> {
        let folded = || {
            let path = rel_path.to_lowercase();
            self.rules
                .iter()
                .rev()
                .find(|r| glob_match(&r.glob.to_lowercase(), &path))
        };
        match case {
            GlobCase::Sensitive => Ok(self.rule_for(rel_path)),
            GlobCase::Insensitive => Ok(folded()),
            GlobCase::Refuse => {
                let (exact, folded) = (self.rule_for(rel_path), folded());
                if exact.map(|r| &r.grants) == folded.map(|r| &r.grants) {
                    Ok(exact)
                } else {
                    Err(CaseDependent {
                        exact: exact.map(|r| r.line),
                        folded: folded.map(|r| r.line),
                    })
                }
            }
        }
    }
}

fn check_glob(glob: &str) -> std::result::Result<(), String> {
    match glob_problem(glob) {
        Some(why) => Err(format!("`path` {why}")),
        None => Ok(()),
    }
}

/// What is wrong with `glob` as a glob of [`glob_match`] (`None`: nothing): empty, longer than
/// [`MAX_GLOB_BYTES`], absolute, with `\\` or control characters, with an empty, `.` or `..`
/// segment, or with more than [`MAX_GLOB_STARS`] `*`. Worded to follow the glob's name.
pub fn glob_problem(glob: &str) -> Option<String> {
    if glob.is_empty() {
        return Some("is empty".into());
    }
    if glob.len() > MAX_GLOB_BYTES {
        return Some(format!("is longer than {MAX_GLOB_BYTES} bytes"));
    }
    if glob.starts_with('/') || glob.contains('\\') || glob.chars().any(char::is_control) {
        return Some(
            "must be relative to the folder, `/`-separated, without control characters".into(),
        );
    }
    if glob
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return Some("has an empty, `.` or `..` segment".into());
    }
    if glob.matches('*').count() > MAX_GLOB_STARS {
        return Some(format!("has more than {MAX_GLOB_STARS} `*`"));
    }
    None
}

/// Whether `path` matches `glob` (see the module documentation).
pub fn glob_match(glob: &str, path: &str) -> bool {
    let g: Vec<&str> = glob.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    match_segments(&g, &p)
}

fn match_segments(g: &[&str], p: &[&str]) -> bool {
    match g.split_first() {
        None => p.is_empty(),
        Some((&"**", rest)) => (0..=p.len()).any(|skip| match_segments(rest, &p[skip..])),
        Some((seg, rest)) => match p.split_first() {
            Some((name, prest)) => {
                match_segment(seg.as_bytes(), name.as_bytes()) && match_segments(rest, prest)
            }
            None => false,
        },
    }
}

/// `*` and `?` within one segment (iterative, with one backtrack point: linear in practice).
fn match_segment(g: &[u8], s: &[u8]) -> bool {
    let (mut gi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if gi < g.len() && g[gi] == b'*' {
            star = Some((gi, si));
            gi += 1;
        } else if gi < g.len() && (g[gi] == s[si] || (g[gi] == b'?' && is_char_start(s, si))) {
            if g[gi] == b'?' {
                si += char_len(s, si);
            } else {
                si += 1;
            }
            gi += 1;
        } else if let Some((sg, ss)) = star {
            gi = sg + 1;
            si = ss + char_len(s, ss);
            star = Some((sg, si));
        } else {
            return false;
        }
    }
    g[gi..].iter().all(|&b| b == b'*')
}

fn is_char_start(s: &[u8], i: usize) -> bool {
    s[i] & 0xC0 != 0x80
}

/// Length of the UTF-8 character starting at `i` (1 for a stray byte).
fn char_len(s: &[u8], i: usize) -> usize {
    let mut n = 1;
    while i + n < s.len() && s[i + n] & 0xC0 == 0x80 {
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_segments() {
        for (g, p, want) in [
            ("*.pdf", "a.pdf", true),
            ("*.pdf", "dir/a.pdf", false),
            ("**/*.pdf", "a.pdf", true),
            ("**/*.pdf", "x/y/a.pdf", true),
            ("credit/**", "credit/a/b.docx", true),
            ("credit/**", "credit", true),
            ("credit/**", "creditx/a", false),
            ("board/??-*.pptx", "board/q3-deck.pptx", true),
            ("board/??-*.pptx", "board/q-deck.pptx", false),
            ("r?sumé.txt", "résumé.txt", true),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("exact.csv", "exact.csv", true),
            ("exact.csv", "exact.csvx", false),
        ] {
            assert_eq!(glob_match(g, p), want, "{g} vs {p}");
        }
    }

    #[test]
    fn the_last_matching_rule_wins() {
        let s = Sidecar::parse(
            "d/.acl.jsonl",
            br#"{"path": "**", "groups": ["staff"]}
# exceptions after the broad rule
{"path": "board/**", "users": ["ceo"], "groups": ["board"]}

{"path": "board/public-*.pdf", "groups": ["staff"]}
"#,
        )
        .unwrap();
        assert_eq!(s.rules.len(), 3);
        assert_eq!(s.rule_for("memo.eml").unwrap().line, 1);
        assert_eq!(s.rule_for("board/minutes.pdf").unwrap().line, 3);
        assert_eq!(s.rule_for("board/public-notice.pdf").unwrap().line, 5);
        assert_eq!(
            s.rule_for("board/minutes.pdf").unwrap().grants.users,
            vec!["ceo".to_string()]
        );
        let none = Sidecar::parse("x", br#"{"path": "a/*.pdf", "users": ["u"]}"#).unwrap();
        assert!(none.rule_for("b/c.pdf").is_none());
    }

    #[test]
    fn case_is_matched_as_configured_and_refused_when_it_decides() {
        let s = Sidecar::parse(
            "d/.acl.jsonl",
            br#"{"path": "**", "groups": ["staff"]}
{"path": "hr/**", "groups": ["hr"]}
{"path": "Board/*.PDF", "groups": ["staff"]}
"#,
        )
        .unwrap();
        let line =
            |r: std::result::Result<Option<&AclRule>, CaseDependent>| r.map(|r| r.map(|r| r.line));
        // `HR/` on a case-insensitive share is the `hr/` folder.
        assert_eq!(
            line(s.rule_with("HR/pay.xlsx", GlobCase::Insensitive)),
            Ok(Some(2))
        );
        assert_eq!(
            line(s.rule_with("HR/pay.xlsx", GlobCase::Sensitive)),
            Ok(Some(1))
        );
        assert_eq!(
            s.rule_with("HR/pay.xlsx", GlobCase::Refuse).unwrap_err(),
            CaseDependent {
                exact: Some(1),
                folded: Some(2)
            }
        );
        // Where case changes nothing, every mode agrees.
        for case in [GlobCase::Refuse, GlobCase::Sensitive, GlobCase::Insensitive] {
            assert_eq!(line(s.rule_with("hr/pay.xlsx", case)), Ok(Some(2)));
            assert_eq!(line(s.rule_with("memo.txt", case)), Ok(Some(1)));
        }
        // Two rules with the same grant: not case-dependent.
        assert_eq!(
            line(s.rule_with("board/a.pdf", GlobCase::Refuse)),
            Ok(Some(1))
        );
        assert_eq!(
            line(s.rule_with("board/a.pdf", GlobCase::Insensitive)),
            Ok(Some(3))
        );
        let only = Sidecar::parse("x", br#"{"path": "Secret/**", "users": ["ceo"]}"#).unwrap();
        assert_eq!(
            s.rule_with("x", GlobCase::Refuse).map(|r| r.is_some()),
            Ok(true)
        );
        assert_eq!(
            only.rule_with("secret/a.txt", GlobCase::Refuse)
                .unwrap_err(),
            CaseDependent {
                exact: None,
                folded: Some(1)
            }
        );
        assert!(
            CaseDependent {
                exact: None,
                folded: Some(1)
            }
            .to_string()
            .contains("no rule matching exactly, line 1 ignoring case")
        );
    }

    #[test]
    fn a_bad_line_names_the_file_and_line() {
        for (text, line, what) in [
            ("{\"path\": \"*\"}\nnot json\n", 2, "expected"),
            ("\n\n{\"path\": \"/abs\"}", 3, "relative"),
            ("{\"path\": \"a/../b\"}", 1, "`..`"),
            ("{\"path\": \"*\", \"user\": [\"x\"]}", 1, "unknown field"),
            ("{\"path\": \"*\", \"users\": [\"\"]}", 1, "empty"),
            ("{\"path\": \"\"}", 1, "empty"),
        ] {
            let e = Sidecar::parse("dir/.acl.jsonl", text.as_bytes()).unwrap_err();
            let msg = e.to_string();
            match e {
                Error::InvalidJsonl {
                    source_name,
                    line: l,
                    reason,
                } => {
                    assert_eq!(source_name, "dir/.acl.jsonl");
                    assert_eq!(l, line, "{text:?}: {msg}");
                    assert!(reason.contains(what), "{text:?}: {msg}");
                }
                e => panic!("{e:?}"),
            }
        }
        let many = "{\"path\": \"*\"}\n".repeat(MAX_SIDECAR_RULES + 1);
        assert!(Sidecar::parse("s", many.as_bytes()).is_err());
        let stars = format!("{{\"path\": \"{}\"}}", "*a".repeat(MAX_GLOB_STARS + 1));
        assert!(Sidecar::parse("s", stars.as_bytes()).is_err());
        let long = format!("{{\"path\": \"{}\"}}", "a".repeat(MAX_GLOB_BYTES + 1));
        assert!(Sidecar::parse("s", long.as_bytes()).is_err());
        let ok = format!("{{\"path\": \"{}\"}}", "a".repeat(MAX_GLOB_BYTES));
        assert!(Sidecar::parse("s", ok.as_bytes()).is_ok());
        let big = vec![b'\n'; MAX_SIDECAR_BYTES + 1];
        assert!(matches!(
            Sidecar::parse("s", &big),
            Err(Error::InvalidJsonl { line: 0, .. })
        ));
        assert!(Sidecar::parse("s", &big[1..]).unwrap().rules.is_empty());
    }
}
