//! Source selection: which retrieved chunks become a chat's prompt sources (the similarity
//! floor, the name check, source focus) and how the chunks of a two-subject question's facets
//! are merged.

use airlock_retrieval::{Embed, SearchResult};

use crate::{Count, Meter};

/// How a chat chooses its prompt sources among the retrieved chunks (docs/operations/answer-sources.md).
#[derive(Clone, Copy)]
pub(crate) struct SourceSelection<'a> {
    /// `min_source_similarity`.
    pub(crate) floor: f32,
    /// `abstain_on_unmatched_names`.
    pub(crate) check_names: bool,
    /// `source_focus`.
    pub(crate) focus: f32,
    /// `source_focus_near_copy`.
    pub(crate) near_copy: f32,
    /// The embedder for focus's semantic judgement (`semantic_focus`, full pipeline only).
    pub(crate) embedder: Option<&'a dyn Embed>,
}

/// Keeps the retrieved chunks that may serve as prompt sources: chunks too far from the
/// question go (without them a small model answers from whatever it was given instead of
/// saying it cannot find it); all go when the question names something none of them
/// mentions (another vendor, person, project), however close their topic; of the rest, the
/// documents missing one of the question's names go when another document has them all
/// ([`crate::focus::naming_all`]); and then the documents that match the question's
/// distinguishing words clearly less well than the best one ([`crate::focus`]: near-copies
/// about another segment, person or branch).
pub(crate) fn keep_prompt_sources(
    chunks: &mut Vec<SearchResult>,
    query: &str,
    sel: SourceSelection,
    metrics: &dyn Meter,
) {
    let before = chunks.len();
    chunks.retain(|c| c.stage_scores.rescore.is_none_or(|s| s >= sel.floor));
    if chunks.len() < before {
        metrics.count(Count::BelowFloor, (before - chunks.len()) as u64);
    }
    if sel.check_names && !chunks.is_empty() {
        let texts: Vec<String> = chunks
            .iter()
            .map(|c| format!("{}\n{}", c.title, c.text))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        if !crate::cite::unmatched_names(query, &refs).is_empty() {
            metrics.count(Count::UnmatchedNames, 1);
            chunks.clear();
        }
    }
    if sel.focus > 0.0 && chunks.len() > 1 {
        let candidates = focus_candidates(chunks);
        let naming = crate::focus::naming_all(query, &candidates);
        if let Some(keep) = naming {
            let keep = only_near_copies(&candidates, keep, sel.near_copy);
            metrics.count(Count::OutOfFocus, retain_kept(chunks, keep));
        }
    }
    if sel.focus > 0.0 && chunks.len() > 1 {
        let candidates = focus_candidates(chunks);
        let judgement = sel.embedder.and_then(|e| {
            crate::focus::semantic_judgement(query, &candidates, |t| e.embed(t))
                .unwrap_or_else(|err| {
                    tracing::warn!(error = %err, "semantic focus: embedding failed; lexical focus only");
                    None
                })
        });
        let keep = match judgement {
            Some((cosines, embedded)) => {
                metrics.count(Count::FocusSentences, embedded as u64);
                crate::focus::keep_semantic(query, &candidates, sel.focus, &cosines)
            }
            None => crate::focus::keep(query, &candidates, sel.focus),
        };
        let keep = only_near_copies(&candidates, keep, sel.near_copy);
        metrics.count(Count::OutOfFocus, retain_kept(chunks, keep));
    }
}

/// The prompt sources of a question retrieved once per facet: the lists taken in turn (each
/// facet's best first), a chunk already taken skipped, at most `k`. One list is returned as is.
pub(crate) fn interleave(lists: Vec<Vec<SearchResult>>, k: usize) -> Vec<SearchResult> {
    if lists.len() == 1 {
        return lists.into_iter().next().unwrap_or_default();
    }
    let mut out: Vec<SearchResult> = Vec::new();
    let mut iters: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut any = true;
    while any && out.len() < k {
        any = false;
        for it in &mut iters {
            if out.len() >= k {
                break;
            }
            for c in it.by_ref() {
                any = true;
                if !out.iter().any(|o| o.chunk_id == c.chunk_id) {
                    out.push(c);
                    break;
                }
            }
        }
    }
    out
}

/// `keep` with every document restored whose retrieved chunks are not a near-copy of a kept
/// document's: their content words (with the title's) overlap less than `min_overlap`
/// (Jaccard). Focus is for near-copies that differ in the detail asked about; a document that
/// only scored lower is no near-copy and stays a source. `min_overlap` 0 keeps `keep` as it is.
fn only_near_copies(
    candidates: &[crate::focus::Candidate<'_>],
    keep: Vec<bool>,
    min_overlap: f32,
) -> Vec<bool> {
    if min_overlap <= 0.0 || keep.iter().all(|k| *k) {
        return keep;
    }
    // Each document's content words over its retrieved chunks, and whether focus kept it.
    let mut docs: Vec<(&str, std::collections::HashSet<String>, bool)> = Vec::new();
    for (c, &k) in candidates.iter().zip(&keep) {
        let i = match docs.iter().position(|d| d.0 == c.doc_id) {
            Some(i) => i,
            None => {
                docs.push((
                    c.doc_id,
                    crate::cite::content_words(c.title).collect(),
                    false,
                ));
                docs.len() - 1
            }
        };
        docs[i].1.extend(crate::cite::content_words(c.text));
        docs[i].2 |= k;
    }
    let overlap = |a: &std::collections::HashSet<String>, b: &std::collections::HashSet<String>| {
        let common = a.intersection(b).count();
        let union = a.len() + b.len() - common;
        if union == 0 {
            0.0
        } else {
            common as f32 / union as f32
        }
    };
    let restored: Vec<&str> = docs
        .iter()
        .filter(|(_, words, kept)| {
            !kept
                && docs
                    .iter()
                    .filter(|d| d.2)
                    .all(|(_, other, _)| overlap(words, other) < min_overlap)
        })
        .map(|d| d.0)
        .collect();
    candidates
        .iter()
        .zip(keep)
        .map(|(c, k)| k || restored.contains(&c.doc_id))
        .collect()
}

/// Keeps the chunks whose flag in `keep` is set (one per chunk, in order); returns how many went.
fn retain_kept(chunks: &mut Vec<SearchResult>, keep: Vec<bool>) -> u64 {
    let before = chunks.len();
    let mut it = keep.into_iter();
    chunks.retain(|_| it.next().unwrap_or(true));
    (before - chunks.len()) as u64
}

/// The chunks as source-focus candidates.
fn focus_candidates(chunks: &[SearchResult]) -> Vec<crate::focus::Candidate<'_>> {
    chunks
        .iter()
        .map(|c| crate::focus::Candidate {
            doc_id: &c.doc_id,
            title: &c.title,
            text: &c.text,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use airlock_retrieval::SearchResult;

    use super::{interleave, only_near_copies};
    use crate::focus::Candidate;

    fn chunk(id: u32) -> SearchResult {
        SearchResult {
            chunk_id: id,
            doc_id: format!("doc-{id}"),
            doc_ordinal: id,
            title: String::new(),
            position: 0,
            text: String::new(),
            score: 0.0,
            stage_scores: Default::default(),
        }
    }

    #[test]
    fn focus_sets_aside_only_near_copies_of_a_kept_document() {
        let c = |doc_id, text| Candidate {
            doc_id,
            title: "",
            text,
        };
        let kept = "Tier 1 SME clients booked in Warsaw: outbound wire payments capped at PLN \
                    400,000 a day, released by the payments desk.";
        let copy = "Tier 2 SME clients booked in Warsaw: outbound wire payments capped at PLN \
                    900,000 a day, released by the payments desk.";
        let other = "To change the proxy APT uses, set Acquire::http::Proxy in a file under \
                     /etc/apt/apt.conf.d/.";
        let cands = [c("a", kept), c("b", copy), c("c", other), c("c", other)];
        let focus = vec![true, false, false, false];
        // Off: focus's own decision.
        assert_eq!(only_near_copies(&cands, focus.clone(), 0.0), focus);
        // The near-copy stays aside, the unrelated page (both its chunks) comes back.
        assert_eq!(
            only_near_copies(&cands, focus.clone(), 0.5),
            [true, false, true, true]
        );
        // Nothing set aside: nothing to restore.
        assert_eq!(only_near_copies(&cands, vec![true; 4], 0.5), [true; 4]);
    }

    #[test]
    fn facet_sources_take_turns_without_repeats_up_to_k() {
        let ids = |v: Vec<SearchResult>| v.iter().map(|c| c.chunk_id).collect::<Vec<_>>();
        let lists = || vec![vec![chunk(1), chunk(2), chunk(3)], vec![chunk(2), chunk(4)]];
        assert_eq!(ids(interleave(lists(), 10)), [1, 2, 3, 4]);
        assert_eq!(ids(interleave(lists(), 3)), [1, 2, 3]);
        // One facet found nothing: the other's sources stand; one list is kept as it is.
        assert_eq!(ids(interleave(vec![vec![], vec![chunk(5)]], 4)), [5]);
        assert_eq!(ids(interleave(vec![vec![chunk(7), chunk(6)]], 1)), [7, 6]);
    }
}
