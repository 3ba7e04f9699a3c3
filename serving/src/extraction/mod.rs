//! Extraction of outside bytes under a budget it cannot exceed.
//!
//! Every file uploaded (`PUT /v1/documents/{id}` with a raw file) or ingested from a folder
//! (`airlock ingest DIR`) in a format with a parser behind it (PDF, Office, e-mail, CSV, HTML) is
//! extracted in a worker process: the same binary run as `airlock extract --child`, which
//! before it reads a byte limits its own address space (`RLIMIT_AS`: its size at start plus
//! `max_memory_mib`), its CPU time per file (`RLIMIT_CPU`) and its core dumps, and locks itself
//! down with Landlock (no file system access at all, no TCP). The parent ([`ChildExtractor`])
//! sends the bytes on the worker's stdin, reads the text and its regions on its stdout, kills it
//! at the wall-clock deadline, and reports an overrun as the document's refusal with the code
//! `limit_exceeded`. At most `max_concurrent` workers exist; a worker serves file after file
//! until a limit kills it or it has grown, so ordinary files pay a pipe round trip, not a
//! process start. Shutdown kills the workers instead of waiting for them.
//!
//! Plain text and Markdown have no parser (UTF-8 is checked, the text kept as is) and are read
//! in-process. [`Extractor::InProcess`] runs everything in-process, for library-style tests
//! and benches that do not have the `airlock` binary at hand.

mod pool;
pub mod wire;

use airlock_retrieval::DocumentInput;
use airlock_retrieval::ingest::{ExtractLimits, SourceFormat};
use serde::{Deserialize, Serialize};

pub use pool::{ChildExtractor, ChildProgram};

/// The budget of the process every extraction runs in (`[extract]` next to the extractor's
/// own limits; docs/operations/ingest.md, "Extraction limits").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExtractBudget {
    /// Memory a worker may map above its size at start, MiB (default 1024; at least 64).
    pub max_memory_mib: u64,
    /// CPU seconds one file may use (default 60).
    pub max_cpu_secs: u64,
    /// Wall-clock seconds one file may take, from the request to the worker to its answer
    /// (default 120).
    pub deadline_secs: u64,
    /// Workers at once, so files extracted at once (default 2); more wait for a free one.
    pub max_concurrent: u32,
}

impl Default for ExtractBudget {
    fn default() -> Self {
        Self {
            max_memory_mib: 1024,
            max_cpu_secs: 60,
            deadline_secs: 120,
            max_concurrent: 2,
        }
    }
}

/// The keys of `[extract]` that are [`ExtractBudget`]'s; the others are `ExtractLimits`'.
const BUDGET_KEYS: [&str; 4] = [
    "max_memory_mib",
    "max_cpu_secs",
    "deadline_secs",
    "max_concurrent",
];

impl ExtractBudget {
    /// The first setting out of range, with why.
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.max_memory_mib < 64 {
            return Err((
                "max_memory_mib",
                "must be at least 64 (a worker needs room to read a file at all)",
            ));
        }
        if self.max_cpu_secs == 0 {
            return Err(("max_cpu_secs", "must be positive"));
        }
        if self.deadline_secs == 0 {
            return Err(("deadline_secs", "must be positive"));
        }
        if !(1..=64).contains(&self.max_concurrent) {
            return Err(("max_concurrent", "must be between 1 and 64"));
        }
        Ok(())
    }
}

/// The `[extract]` table: the extractor's limits per file and the budget of the process it runs
/// in, one flat table (unknown keys refused, absent ones default).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(try_from = "toml::Table")]
pub struct ExtractConfig {
    /// Limits the extractor checks itself (pages, zip expansion, nesting, ...).
    pub limits: ExtractLimits,
    /// The worker process's budget.
    pub budget: ExtractBudget,
}

impl TryFrom<toml::Table> for ExtractConfig {
    type Error = String;

    fn try_from(mut table: toml::Table) -> Result<Self, String> {
        let mut budget = toml::Table::new();
        for key in BUDGET_KEYS {
            if let Some(v) = table.remove(key) {
                budget.insert(key.to_owned(), v);
            }
        }
        Ok(Self {
            limits: toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| e.message().to_owned())?,
            budget: toml::Value::Table(budget)
                .try_into()
                .map_err(|e: toml::de::Error| e.message().to_owned())?,
        })
    }
}

/// Why a file did not become a document.
#[derive(Debug, thiserror::Error)]
pub enum ExtractFailure {
    /// The file was refused: a per-document error (not extracted, with its code, among them
    /// `limit_exceeded` for a worker over its budget; too large; not UTF-8; empty; ...).
    #[error(transparent)]
    Document(#[from] airlock_retrieval::Error),
    /// No worker could run it: it could not be started or spoke out of turn. Not the file's
    /// fault.
    #[error("extraction unavailable: {0}")]
    Unavailable(String),
    /// The daemon is stopping: its workers were killed.
    #[error("extraction stopped: the daemon is shutting down")]
    Stopping,
}

/// Where files are extracted.
pub enum Extractor {
    /// In this process, without a budget (tests and benches of the libraries' behaviour).
    InProcess,
    /// In budgeted worker processes.
    Child(ChildExtractor),
}

impl Extractor {
    /// Builds the document of `bytes` read as `format`, as
    /// `airlock_retrieval::ingest::parse_document_with` does, in a worker when this extractor
    /// has them and the format has a parser.
    pub fn document(
        &self,
        doc_id: &str,
        title: Option<&str>,
        bytes: &[u8],
        format: SourceFormat,
        max_bytes: usize,
        limits: &ExtractLimits,
    ) -> Result<DocumentInput, ExtractFailure> {
        let pool = match self {
            Self::Child(pool) if !matches!(format, SourceFormat::Text | SourceFormat::Markdown) => {
                pool
            }
            _ => {
                return Ok(airlock_retrieval::ingest::parse_document_with(
                    doc_id, title, bytes, format, max_bytes, limits,
                )?);
            }
        };
        // What the in-process path checks first, without a worker.
        airlock_retrieval::ingest::validate_doc_id(doc_id)?;
        if bytes.len() > max_bytes {
            return Err(airlock_retrieval::Error::DocumentTooLarge {
                doc_id: doc_id.to_owned(),
                bytes: bytes.len(),
                limit: max_bytes,
            }
            .into());
        }
        pool.document(doc_id, title, bytes, format, max_bytes, limits)
    }

    /// Kills every worker (running extractions fail at once as unavailable) and refuses new
    /// ones: the daemon's shutdown never waits on an extraction.
    pub fn shutdown(&self) {
        if let Self::Child(pool) = self {
            pool.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extract_table_holds_limits_and_budget_and_refuses_unknown_keys() {
        let t: toml::Table =
            toml::from_str("max_pages = 7\ndeadline_secs = 5\nmax_concurrent = 4\n").unwrap();
        let c = ExtractConfig::try_from(t).unwrap();
        assert_eq!(c.limits.max_pages, 7);
        assert_eq!(c.budget.deadline_secs, 5);
        assert_eq!(c.budget.max_concurrent, 4);
        assert_eq!(c.budget.max_memory_mib, 1024);
        for bad in [
            "max_pagez = 1",
            "deadline_sec = 1",
            "max_concurrent = \"x\"",
        ] {
            let t: toml::Table = toml::from_str(bad).unwrap();
            assert!(ExtractConfig::try_from(t).is_err(), "{bad}");
        }
        let check = |b: ExtractBudget| b.check().map_err(|(f, _)| f);
        assert_eq!(check(ExtractBudget::default()), Ok(()));
        for (b, field) in [
            (
                ExtractBudget {
                    max_memory_mib: 63,
                    ..ExtractBudget::default()
                },
                "max_memory_mib",
            ),
            (
                ExtractBudget {
                    max_cpu_secs: 0,
                    ..ExtractBudget::default()
                },
                "max_cpu_secs",
            ),
            (
                ExtractBudget {
                    deadline_secs: 0,
                    ..ExtractBudget::default()
                },
                "deadline_secs",
            ),
            (
                ExtractBudget {
                    max_concurrent: 0,
                    ..ExtractBudget::default()
                },
                "max_concurrent",
            ),
        ] {
            assert_eq!(check(b), Err(field));
        }
    }
}
