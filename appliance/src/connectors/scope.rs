//! A source's `include` and `exclude` globs as the crawl's [`Scope`]: which files under the
//! crawl root are its documents (docs/operations/connectors.md, "Which files").
//!
//! The globs are the folder ingest's (`airlock_retrieval::sidecar::glob_match`: `*` within a
//! segment, `?` one character, `**` any number of segments), over the path relative to the crawl
//! root, matched **without regard to case** (SMB and NTFS names are case-insensitive: `*.PDF`
//! and `*.pdf` name the same files). A file is a document when it matches an `include` glob (or
//! there is none) and no `exclude` glob. A folder is not listed at all when nothing under it
//! can be admitted: an `exclude` glob ending in `/**` matches it, or no `include` glob can match
//! a path under it.

use airlock_connectors::smb::Scope;
use airlock_retrieval::sidecar::glob_match;

/// Most globs in `include` and in `exclude`, each.
pub const MAX_GLOBS: usize = 64;

/// The compiled `include` / `exclude` of one source (lower-cased).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathScope {
    include: Vec<String>,
    exclude: Vec<String>,
}

impl PathScope {
    /// The scope of these globs (already checked by the configuration).
    pub fn new(include: &[String], exclude: &[String]) -> PathScope {
        let lower = |v: &[String]| v.iter().map(|g| g.to_lowercase()).collect();
        PathScope {
            include: lower(include),
            exclude: lower(exclude),
        }
    }

    /// Whether every file is admitted and no folder pruned.
    pub fn is_everything(&self) -> bool {
        self.include.is_empty() && self.exclude.is_empty()
    }
}

impl Scope for PathScope {
    fn admits(&self, path: &str) -> bool {
        let path = path.to_lowercase();
        (self.include.is_empty() || self.include.iter().any(|g| glob_match(g, &path)))
            && !self.exclude.iter().any(|g| glob_match(g, &path))
    }

    fn prunes(&self, folder: &str) -> bool {
        let folder = folder.to_lowercase();
        // `A/**` matching the folder (its part `A` matches the folder or a folder above it)
        // matches every path below it too.
        let excluded = self
            .exclude
            .iter()
            .any(|g| g.ends_with("/**") && glob_match(g, &folder));
        let segments: Vec<&str> = folder.split('/').collect();
        let unreachable = !self.include.is_empty()
            && !self.include.iter().any(|g| {
                let glob: Vec<&str> = g.split('/').collect();
                may_match_below(&glob, &segments)
            });
        excluded || unreachable
    }
}

/// Whether some path strictly below the folder `folder` (its segments) can match `glob` (its
/// segments). Conservative: `**` may always match.
fn may_match_below(glob: &[&str], folder: &[&str]) -> bool {
    match (glob.split_first(), folder.split_first()) {
        // The folder is consumed: a file below it matches when glob segments remain.
        (Some(_), None) => true,
        (None, _) => false,
        (Some((&"**", _)), Some(_)) => true,
        (Some((seg, g_rest)), Some((name, f_rest))) => {
            glob_match(seg, name) && may_match_below(g_rest, f_rest)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(include: &[&str], exclude: &[&str]) -> PathScope {
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        PathScope::new(&own(include), &own(exclude))
    }

    #[test]
    fn files_are_admitted_by_include_and_exclude_without_regard_to_case() {
        let all = scope(&[], &[]);
        assert!(all.is_everything());
        assert!(all.admits("a/b.txt") && !all.prunes("a"));

        let s = scope(&["reports/**", "*.PDF"], &["**/*.tmp", "reports/drafts/**"]);
        assert!(s.admits("Reports/2026/q1.docx"));
        assert!(s.admits("policy.pdf"));
        assert!(!s.admits("sub/policy.pdf"), "`*` stays within one segment");
        assert!(!s.admits("reports/q1.TMP"), "exclude wins over include");
        assert!(!s.admits("reports/drafts/q2.docx"));
        assert!(!s.admits("hr/salaries.xlsx"), "no include matches");
    }

    #[test]
    fn folders_are_pruned_only_when_nothing_below_them_can_be_admitted() {
        let s = scope(&["reports/**", "*.pdf"], &["reports/drafts/**"]);
        assert!(s.prunes("hr"), "no include can match below hr/");
        assert!(!s.prunes("reports"));
        assert!(!s.prunes("REPORTS/2026"));
        assert!(s.prunes("reports/drafts"));
        assert!(s.prunes("Reports/Drafts/old"));

        // `**` can match below every folder; `*` one segment only.
        let s = scope(&["**/*.pdf", "finance/*/*.xlsx"], &["**/tmp/**"]);
        assert!(!s.prunes("hr/2026"));
        assert!(s.prunes("hr/tmp"));
        let s = scope(&["finance/*/*.xlsx"], &[]);
        assert!(!s.prunes("finance"));
        assert!(!s.prunes("finance/2026"));
        assert!(s.prunes("finance/2026/q1"), "the glob ends one level up");
        assert!(s.prunes("hr"));

        // A pruned folder never hides an admitted file: every file below it is refused too.
        for (inc, exc) in [
            (vec!["reports/**", "*.pdf"], vec!["reports/drafts/**"]),
            (vec!["finance/*/*.xlsx"], vec!["**/tmp/**"]),
            (vec![], vec!["a/**", "*/b/**"]),
        ] {
            let s = scope(&inc, &exc);
            for folder in [
                "hr",
                "reports/drafts",
                "finance/2026/q1",
                "a",
                "x/b",
                "x/tmp",
            ] {
                if s.prunes(folder) {
                    for file in ["f.pdf", "q.xlsx", "deep/f.pdf", "deep/er/q.xlsx"] {
                        let path = format!("{folder}/{file}");
                        assert!(
                            !s.admits(&path),
                            "{inc:?} {exc:?}: {path} under a pruned folder"
                        );
                    }
                }
            }
        }
    }
}
