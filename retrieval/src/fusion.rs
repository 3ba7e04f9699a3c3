//! Turning per-retriever hit lists into one ranked candidate list: reciprocal rank fusion and
//! the full-precision rescoring step.

use std::collections::HashMap;

use crate::engine::{SearchMode, StageScores};

/// Which retriever a single-list search came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source {
    Bm25,
    Vector,
}

/// A candidate on its way through the stages.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    pub chunk: u32,
    /// Score of the latest stage; the list is sorted by it.
    pub score: f32,
    pub stage: StageScores,
}

/// One retriever's list as candidates (already best first).
pub(crate) fn single(hits: &[(u32, f32)], source: Source) -> Vec<Candidate> {
    hits.iter()
        .enumerate()
        .map(|(i, &(chunk, score))| {
            let mut stage = StageScores::default();
            match source {
                Source::Bm25 => {
                    stage.bm25 = Some(score);
                    stage.bm25_rank = Some(i as u32 + 1);
                }
                Source::Vector => {
                    stage.vector = Some(score);
                    stage.vector_rank = Some(i as u32 + 1);
                }
            }
            Candidate {
                chunk,
                score,
                stage,
            }
        })
        .collect()
}

/// Reciprocal rank fusion: score = Σ over lists of 1 / (k + rank), ranks 1-based. Sorted best
/// first, ties by ascending chunk id.
pub(crate) fn rrf(bm25: &[(u32, f32)], vector: &[(u32, f32)], k: f32) -> Vec<Candidate> {
    let mut by_chunk: HashMap<u32, Candidate> = HashMap::with_capacity(bm25.len() + vector.len());
    for (i, &(chunk, score)) in bm25.iter().enumerate() {
        let c = by_chunk.entry(chunk).or_insert_with(|| Candidate {
            chunk,
            score: 0.0,
            stage: StageScores::default(),
        });
        c.stage.bm25 = Some(score);
        c.stage.bm25_rank = Some(i as u32 + 1);
        c.score += 1.0 / (k + i as f32 + 1.0);
    }
    for (i, &(chunk, score)) in vector.iter().enumerate() {
        let c = by_chunk.entry(chunk).or_insert_with(|| Candidate {
            chunk,
            score: 0.0,
            stage: StageScores::default(),
        });
        c.stage.vector = Some(score);
        c.stage.vector_rank = Some(i as u32 + 1);
        c.score += 1.0 / (k + i as f32 + 1.0);
    }
    let mut out: Vec<Candidate> = by_chunk
        .into_values()
        .map(|mut c| {
            c.stage.rrf = Some(c.score);
            c
        })
        .collect();
    sort(&mut out);
    out
}

/// Applies full-precision cosines (`exact`, for the first `depth` candidates) to the list.
///
/// Vector mode: the first `depth` are re-ordered by exact cosine. Hybrid: the vector list's
/// approximate ranks are replaced by exact-cosine ranks over all `depth` candidates (so BM25-only
/// candidates get a dense rank too) and RRF is recomputed with the BM25 ranks unchanged.
pub(crate) fn apply_rescore(
    cands: &mut [Candidate],
    depth: usize,
    exact: &[(u32, f32)],
    mode: SearchMode,
    k: f32,
) {
    let exact: HashMap<u32, f32> = exact.iter().copied().collect();
    let head = &mut cands[..depth];
    for c in head.iter_mut() {
        c.stage.rescore = exact.get(&c.chunk).copied();
    }
    match mode {
        SearchMode::Vector => {
            for c in head.iter_mut() {
                c.score = c.stage.rescore.unwrap_or(f32::NEG_INFINITY);
            }
        }
        SearchMode::Hybrid => {
            let mut order: Vec<usize> = (0..head.len()).collect();
            order.sort_by(|&a, &b| {
                let (sa, sb) = (head[a].stage.rescore, head[b].stage.rescore);
                sb.unwrap_or(f32::NEG_INFINITY)
                    .total_cmp(&sa.unwrap_or(f32::NEG_INFINITY))
                    .then(head[a].chunk.cmp(&head[b].chunk))
            });
            for (rank, &i) in order.iter().enumerate() {
                let c = &mut head[i];
                let bm25 = c.stage.bm25_rank.map_or(0.0, |r| 1.0 / (k + r as f32));
                let dense = if c.stage.rescore.is_some() {
                    1.0 / (k + rank as f32 + 1.0)
                } else {
                    0.0
                };
                c.score = bm25 + dense;
            }
        }
        SearchMode::Bm25 => return,
    }
    sort(head);
}

fn sort(c: &mut [Candidate]) {
    c.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.chunk.cmp(&b.chunk)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rrf_rewards_agreement_and_records_stage_scores() {
        let bm25 = [(1, 9.0), (2, 8.0), (3, 7.0)];
        let vec = [(3, 0.9), (4, 0.8), (1, 0.7)];
        let c = rrf(&bm25, &vec, 60.0);
        let order: Vec<u32> = c.iter().map(|c| c.chunk).collect();
        // 1: 1/61 + 1/63; 3: 1/63 + 1/61 (tie, lower id first); 2: 1/62; 4: 1/62.
        assert_eq!(order, vec![1, 3, 2, 4]);
        assert_eq!(c[0].stage.bm25_rank, Some(1));
        assert_eq!(c[0].stage.vector_rank, Some(3));
        assert!((c[0].score - (1.0 / 61.0 + 1.0 / 63.0)).abs() < 1e-7);
        assert_eq!(c[2].stage.vector, None);
    }

    #[test]
    fn rescore_reorders_by_exact_cosine() {
        let mut c = single(&[(1, 0.9), (2, 0.8), (3, 0.7)], Source::Vector);
        apply_rescore(&mut c, 2, &[(1, 0.5), (2, 0.6)], SearchMode::Vector, 60.0);
        let order: Vec<u32> = c.iter().map(|c| c.chunk).collect();
        assert_eq!(order, vec![2, 1, 3]);
        assert_eq!(c[0].stage.rescore, Some(0.6));
        assert_eq!(c[2].stage.rescore, None);

        // Hybrid: a BM25-only candidate with the best exact cosine overtakes.
        let mut h = rrf(&[(1, 5.0), (2, 4.0)], &[(3, 0.9)], 60.0);
        let exact = [(1, 0.1), (2, 0.9), (3, 0.2)];
        apply_rescore(&mut h, 3, &exact, SearchMode::Hybrid, 60.0);
        assert_eq!(h[0].chunk, 2, "{h:?}");
    }
}
