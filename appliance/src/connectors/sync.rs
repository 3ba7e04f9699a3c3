//! One sync of one source: the directory, the listing's changes against the stored state, each
//! change through the daemon's write paths, then the new state.
//!
//! All-or-nothing where it matters: a failure to read the directory or to list the share
//! returns before anything is written (never a mass delete on error); a failure of the store
//! itself stops the sync and leaves the stored state as it was (the next sync redoes the
//! changes, every write being idempotent). A file that cannot be fetched, extracted or stored is
//! an item error: reported in the state, retried at the next sync, and never shown to anyone
//! who may not read it now — a changed file whose new version fails keeps its old content for
//! the readers of both versions only (the intersection), a new one is not stored.

use std::sync::Arc;

use airlock_acl::DocGrants;
use airlock_connectors::access::Readers;
use airlock_connectors::directory::Directory;
use airlock_connectors::source::{Change, SmbSource, Source, SourceState};
use airlock_retrieval::{Original, SourceFormat};

use super::config::ConnectorConfig;
use super::store::{LastRun, RunCounts, Store};
use super::{SyncLimits, now_secs};
use airlock_serving::services::Services;

/// The actor of a source's audit rows and grant changes.
pub(super) fn actor(alias: &str) -> String {
    format!("connector:{alias}")
}

/// A document's id: the source's alias and the file's id on the server (stable across renames
/// and moves within the share).
pub fn doc_id(alias: &str, item: &str) -> String {
    format!("{alias}:{item}")
}

/// The version an item is given when its last upsert failed: never equal to a real one
/// (`size:mtime`), so the next sync tries it again.
const FAILED: &str = "failed";

/// A sync failure, with what had been applied before it.
type Failure = (RunCounts, String);

/// Runs one sync of `cfg`. `Err` carries the counts of what was applied before the failure.
pub(super) async fn sync(
    cfg: &ConnectorConfig,
    services: Arc<Services>,
    store: Arc<Store>,
    limits: SyncLimits,
    started_at: u64,
) -> Result<RunCounts, Failure> {
    let mut counts = RunCounts::default();
    let fail = |counts: &RunCounts, e: String| (counts.clone(), e);
    let (smb, ad) = cfg.library_configs().map_err(|e| fail(&counts, e))?;
    let mut source = SmbSource::connect(smb, ad)
        .await
        .map_err(|e| fail(&counts, format!("connecting to the share: {e}")))?;
    source.max_bytes = cfg.max_file_bytes();
    let directory = source
        .principals()
        .await
        .map_err(|e| fail(&counts, format!("reading the directory: {e}")))?;
    let alias = cfg.alias.clone();
    let state = blocking({
        let (store, alias) = (store.clone(), alias.clone());
        move || store.state(&alias).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| fail(&counts, e))?;
    let listed = source
        .changes(&state, &directory)
        .await
        .map_err(|e| fail(&counts, format!("listing the share: {e}")))?;
    let mut next = listed.next;
    let actor = actor(&alias);
    let writes = Writes {
        services: &services,
        limits: &limits,
        cfg,
        actor: &actor,
        directory: &directory,
    };
    for change in listed.changes {
        apply_change(&writes, &mut source, &state, &mut next, &mut counts, change)
            .await
            .map_err(|e| fail(&counts, e))?;
    }
    counts.items = next.items.len();
    let run = LastRun {
        started_at,
        finished_at: now_secs(),
        error: None,
        counts: counts.clone(),
    };
    next.last_success = Some(now_secs());
    let saved_counts = counts.clone();
    blocking(move || {
        store
            .succeeded(&alias, &next, &run)
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| fail(&saved_counts, e))?;
    Ok(counts)
}

/// Applies one change of the listing through the daemon's write paths, counting it in
/// `counts` and recording item errors in `next`. `Err`: the store failed (the sync stops).
async fn apply_change(
    w: &Writes<'_>,
    source: &mut SmbSource,
    state: &SourceState,
    next: &mut SourceState,
    counts: &mut RunCounts,
    change: Change,
) -> Result<(), String> {
    let alias = &w.cfg.alias;
    match change {
        Change::Upsert {
            id,
            path,
            version: _,
            readers,
        } => {
            let doc = doc_id(alias, &id);
            let old = state.items.get(&id).map(|i| i.readers.clone());
            let outcome = upsert(w, source, &doc, &path, &readers, Reuse::SameBytes).await?;
            match outcome {
                Upserted::Stored => counts.upserted += 1,
                Upserted::SameContent => counts.unchanged_content += 1,
                Upserted::Refused(reason) => {
                    counts.failed += 1;
                    // Stored for nobody new: the old content (if any) for the readers of both
                    // versions only.
                    let kept = match &old {
                        Some(o) => Readers {
                            users: o.users.intersection(&readers.users).cloned().collect(),
                        },
                        None => Readers::default(),
                    };
                    if old.is_some() {
                        write_grant(w, doc, &kept).await?;
                    }
                    if let Some(item) = next.items.get_mut(&id) {
                        item.version = FAILED.to_owned();
                        item.readers = kept;
                    }
                    next.errors.push((path, reason));
                }
            }
        }
        Change::Permissions { id, readers } => {
            write_grant(w, doc_id(alias, &id), &readers).await?;
            counts.permissions += 1;
        }
        // The document keeps its id. Its title (the file's name) is in every chunk's index
        // text and its path in the metadata citations show, so a rename re-stores it from
        // the file (renames are rare; a permission-only change never comes here). A file
        // that cannot be stored again keeps its old name (its content is still the file's:
        // the version did not change) and is an item error, retried at the next sync.
        Change::Moved { id, path } => {
            let doc = doc_id(alias, &id);
            let readers = next.items.get(&id).map(|i| i.readers.clone());
            let readers = readers.unwrap_or_default();
            let outcome = upsert(w, source, &doc, &path, &readers, Reuse::Never).await?;
            match outcome {
                Upserted::Stored | Upserted::SameContent => counts.moved += 1,
                Upserted::Refused(reason) => {
                    counts.failed += 1;
                    if let Some(item) = next.items.get_mut(&id) {
                        item.version = FAILED.to_owned();
                    }
                    next.errors.push((path, reason));
                }
            }
        }
        Change::Delete { id } => {
            let (s, d) = (w.services.clone(), doc_id(alias, &id));
            blocking(move || {
                s.retrieval
                    .delete(&d)
                    .map(drop)
                    .map_err(|e| format!("{d}: tombstoning: {e}"))
            })
            .await?;
            counts.deleted += 1;
        }
    }
    Ok(())
}

/// Sets document `doc`'s grant to that of `readers`.
async fn write_grant(w: &Writes<'_>, doc: String, readers: &Readers) -> Result<(), String> {
    let g = grants(readers, w.directory);
    let (s, a, d) = (w.services.clone(), w.actor.to_owned(), doc);
    blocking(move || {
        s.acl
            .set_document_grants(a.as_str(), &d, &g)
            .map(drop)
            .map_err(|e| format!("{d}: updating the grant: {e}"))
    })
    .await
}

/// The grant of `readers`: their directory names (sAMAccountName), no groups (deny ACEs make a
/// group-level grant wrong in general; the crate expands to users).
fn grants(readers: &Readers, directory: &Directory) -> DocGrants {
    DocGrants {
        users: readers.user_names(directory),
        groups: Vec::new(),
    }
}

/// Whether an upsert may keep the stored document when the file's bytes are the stored ones.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reuse {
    /// Yes: only the grant is written (a touched file, a state lost).
    SameBytes,
    /// No: the document is stored again (a rename: its title and path changed).
    Never,
}

enum Upserted {
    /// Extracted and stored with its grant.
    Stored,
    /// The bytes are those stored already: the grant alone was written.
    SameContent,
    /// The file was refused (an item error, with the reason).
    Refused(String),
}

/// What every write of one sync shares.
struct Writes<'a> {
    services: &'a Arc<Services>,
    limits: &'a SyncLimits,
    cfg: &'a ConnectorConfig,
    actor: &'a str,
    directory: &'a Directory,
}

/// Fetches, extracts and stores one file with the grant of `readers`. `Err`: the store failed
/// (the sync stops); a refusal of the file is `Ok(Refused)`.
async fn upsert(
    w: &Writes<'_>,
    source: &mut SmbSource,
    doc_id: &str,
    path: &str,
    readers: &Readers,
    reuse: Reuse,
) -> Result<Upserted, String> {
    let (services, limits, cfg, actor) = (w.services, w.limits, w.cfg, w.actor);
    let grants = grants(readers, w.directory);
    let name = path.rsplit('/').next().unwrap_or(path).to_owned();
    let Some(format) = name
        .rsplit_once('.')
        .and_then(|(_, ext)| SourceFormat::from_extension(ext))
    else {
        return Ok(Upserted::Refused("unsupported file type".into()));
    };
    let bytes = match source.fetch(path).await {
        Ok(b) => b,
        Err(e) => return Ok(Upserted::Refused(format!("fetching: {e}"))),
    };
    let (s, limits) = (services.clone(), limits.clone());
    let (actor, doc_id, path, alias) = (
        actor.to_owned(),
        doc_id.to_owned(),
        path.to_owned(),
        cfg.alias.clone(),
    );
    blocking(move || {
        use airlock_serving::extraction::ExtractFailure as F;
        let digest = airlock_retrieval::sha256_hex(&bytes);
        let stored = s
            .retrieval
            .original_digest(&doc_id)
            .map_err(|e| format!("{doc_id}: {e}"))?;
        if reuse == Reuse::SameBytes && stored.as_deref() == Some(digest.as_str()) {
            s.acl
                .set_document_grants(actor.as_str(), &doc_id, &grants)
                .map_err(|e| format!("{doc_id}: updating the grant: {e}"))?;
            return Ok(Upserted::SameContent);
        }
        let max = s.retrieval.config().max_document_bytes;
        let mut doc = match s.extractor.document(
            &doc_id,
            Some(name.as_str()),
            &bytes,
            format,
            max,
            &limits.extract,
        ) {
            Ok(d) => d,
            Err(F::Document(e)) => return Ok(Upserted::Refused(e.to_string())),
            Err(F::Unavailable(why)) => return Err(format!("extraction unavailable: {why}")),
            Err(F::Stopping) => return Err("the daemon is stopping".into()),
        };
        let mut metadata = serde_json::Map::new();
        metadata.insert("source".into(), alias.into());
        metadata.insert("path".into(), path.into());
        doc.metadata = metadata;
        doc.original = Some(Original::new(format.media_type(), bytes));
        let staged = match s.retrieval.stage(doc) {
            Ok(st) => st,
            Err(e) if e.is_user_error() => return Ok(Upserted::Refused(e.to_string())),
            Err(e) => return Err(format!("{doc_id}: {e}")),
        };
        crate::document_write::store_with_grant(
            &s.acl,
            &s.retrieval,
            actor.as_str().into(),
            &doc_id,
            &grants,
            staged,
        )
        .map_err(|e| format!("{doc_id}: storing: {}", e.problem().detail))?;
        Ok(Upserted::Stored)
    })
    .await
}

/// Runs `f` on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| format!("connector task failed: {e}"))?
}
