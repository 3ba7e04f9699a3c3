//! Two-level readable sets. The published state keeps one bitmap per group (the documents granted
//! to it) and one per user named on a document (their direct grants): a [`Part`] each, shared by
//! every user it concerns and by consecutive published states until that group's or user's
//! grants change. Memory grows with the distinct grants, not with users × documents.
//!
//! A user's readable set is the union of their parts. `can_read` probes the parts; a request's
//! [`AllowSet`] is the union materialised once per request ([`AllowCache::allow_set`]): a user
//! with one part gets that part's bitmap itself, others a union kept in a bounded LRU keyed by
//! the parts' ids, so users with the same groups and no direct grant share one materialised set
//! and a repeated request costs a lookup.
//!
//! Access-changed counts (how many users' sets a change altered) compare a user's old and new
//! parts without materialising either in the common case ([`access_changed`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use roaring::RoaringBitmap;

use crate::allow::AllowSet;
use crate::model::{Name, materialise};

/// The documents granted to one group or to one user id by name, as the writer keeps them and
/// readers see them. The id names this exact content for the life of the process: every edit
/// gives a new one, so an id is a safe cache key for unions of parts.
#[derive(Clone, Debug)]
pub(crate) struct Part {
    pub id: u64,
    pub bits: Arc<RoaringBitmap>,
}

static NEXT_PART_ID: AtomicU64 = AtomicU64::new(1);

fn fresh_id() -> u64 {
    NEXT_PART_ID.fetch_add(1, Ordering::Relaxed)
}

impl Part {
    /// A part holding `bits`, with a new id.
    pub fn new(bits: RoaringBitmap) -> Self {
        Self {
            id: fresh_id(),
            bits: Arc::new(bits),
        }
    }

    /// The writer's mutable access: copies the bitmap first if a published state shares it
    /// (copy on write, once per part per change) and gives the part a new id either way.
    pub fn edit(&mut self) -> &mut RoaringBitmap {
        self.id = fresh_id();
        Arc::make_mut(&mut self.bits)
    }
}

impl Default for Part {
    fn default() -> Self {
        Self::new(RoaringBitmap::new())
    }
}

/// The default byte budget of the materialised-union cache: 64 MiB, e.g. ~500 users' sets of
/// ~130 KiB (a third of 1M documents) or ~50 sets of 1.2 MiB (10M documents).
pub(crate) const ALLOW_CACHE_BYTES: usize = 64 << 20;
/// The default entry limit of the cache (keys and bookkeeping stay small however tiny the sets).
pub(crate) const ALLOW_CACHE_ENTRIES: usize = 16_384;

/// What the cache holds now (for the bench's accounting and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheUse {
    /// Materialised unions held.
    pub entries: usize,
    /// Their bytes (roaring serialized size, the same measure as the budget).
    pub bytes: usize,
}

/// A bounded LRU of materialised unions keyed by the sorted ids of their parts. Shared by every
/// published state of one [`crate::Acl`]; entries of parts no longer published are never hit
/// again and age out.
#[derive(Debug)]
pub(crate) struct AllowCache {
    budget_bytes: usize,
    max_entries: usize,
    lru: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    map: HashMap<Box<[u64]>, Entry>,
    /// Last use → key; the first entry is the least recently used.
    order: BTreeMap<u64, Box<[u64]>>,
    bytes: usize,
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    bits: Arc<RoaringBitmap>,
    bytes: usize,
    used: u64,
}

impl Default for AllowCache {
    fn default() -> Self {
        Self::new(ALLOW_CACHE_BYTES, ALLOW_CACHE_ENTRIES)
    }
}

impl AllowCache {
    /// A cache holding at most `budget_bytes` of sets and `max_entries` entries. A set larger
    /// than the budget is never cached.
    pub fn new(budget_bytes: usize, max_entries: usize) -> Self {
        Self {
            budget_bytes,
            max_entries,
            lru: Mutex::new(Lru::default()),
        }
    }

    /// The readable set of a user whose parts are `parts`: the union, materialised at most once
    /// while it stays cached. Built only from the immutable parts of one published state, so it
    /// is that state's set whatever a writer does meanwhile.
    pub fn allow_set<'a>(&self, parts: impl IntoIterator<Item = &'a Part>) -> AllowSet {
        let parts: Vec<&Part> = parts.into_iter().collect();
        match parts.as_slice() {
            [] => return AllowSet::empty(),
            [one] => return AllowSet::from_arc(one.bits.clone()),
            _ => {}
        }
        let mut key: Vec<u64> = parts.iter().map(|p| p.id).collect();
        key.sort_unstable();
        key.dedup();
        let key = key.into_boxed_slice();
        if let Some(bits) = self.get(&key) {
            return AllowSet::from_arc(bits);
        }
        // The union runs outside the lock; two requests racing for one key both compute it and
        // the first insert wins.
        let bits = Arc::new(materialise(None, parts.iter().map(|p| &*p.bits)));
        AllowSet::from_arc(self.insert(key, bits))
    }

    fn get(&self, key: &[u64]) -> Option<Arc<RoaringBitmap>> {
        let mut guard = self.lru.lock();
        let lru = &mut *guard;
        lru.clock += 1;
        let now = lru.clock;
        let e = lru.map.get_mut(key)?;
        let k = lru.order.remove(&e.used)?;
        e.used = now;
        lru.order.insert(now, k);
        Some(e.bits.clone())
    }

    fn insert(&self, key: Box<[u64]>, bits: Arc<RoaringBitmap>) -> Arc<RoaringBitmap> {
        let bytes = bits.serialized_size();
        if bytes > self.budget_bytes || self.max_entries == 0 {
            return bits;
        }
        let mut guard = self.lru.lock();
        let lru = &mut *guard;
        if let Some(e) = lru.map.get(&key) {
            return e.bits.clone();
        }
        lru.clock += 1;
        let used = lru.clock;
        lru.order.insert(used, key.clone());
        lru.map.insert(
            key,
            Entry {
                bits: bits.clone(),
                bytes,
                used,
            },
        );
        lru.bytes += bytes;
        while lru.bytes > self.budget_bytes || lru.map.len() > self.max_entries {
            let Some((_, oldest)) = lru.order.pop_first() else {
                break;
            };
            if let Some(e) = lru.map.remove(&oldest) {
                lru.bytes -= e.bytes;
            }
        }
        bits
    }

    /// What the cache holds now.
    pub fn usage(&self) -> CacheUse {
        let lru = self.lru.lock();
        CacheUse {
            entries: lru.map.len(),
            bytes: lru.bytes,
        }
    }
}

/// How many candidate documents [`access_changed`] probes before it compares whole unions.
pub(crate) const CANDIDATE_BUDGET: usize = 256;

/// One user's parts by origin: their groups (sorted by name, `None`: a group with no documents)
/// and their direct grants.
#[derive(Clone, Copy)]
pub(crate) struct Lineages<'a> {
    pub groups: &'a [(Name, Option<Part>)],
    pub direct: Option<&'a Part>,
}

impl<'a> Lineages<'a> {
    /// The non-empty parts.
    pub fn parts(self) -> impl Iterator<Item = &'a Part> + Clone {
        self.direct
            .into_iter()
            .chain(self.groups.iter().filter_map(|(_, p)| p.as_ref()))
    }

    fn reads(self, doc: u32) -> bool {
        self.parts().any(|p| p.bits.contains(doc))
    }
}

/// The documents that changed in a part whose id went from `old` to `new`: `old ⊕ new`.
pub(crate) type Deltas = HashMap<(u64, u64), RoaringBitmap>;

/// The pairs of parts (old, new) of one origin that differ, for [`Deltas`]: `f(old, new)`.
pub(crate) fn changed_pairs<'a>(
    old: Lineages<'a>,
    new: Lineages<'a>,
    mut f: impl FnMut(Option<&'a Part>, Option<&'a Part>),
) {
    let (mut i, mut j) = (0, 0);
    let (og, ng) = (old.groups, new.groups);
    while i < og.len() || j < ng.len() {
        let (o, n) = match (og.get(i), ng.get(j)) {
            (Some(a), Some(b)) if a.0 == b.0 => {
                i += 1;
                j += 1;
                (a.1.as_ref(), b.1.as_ref())
            }
            (Some(a), Some(b)) if a.0 < b.0 => {
                i += 1;
                (a.1.as_ref(), None)
            }
            (Some(a), None) => {
                i += 1;
                (a.1.as_ref(), None)
            }
            (_, Some(b)) => {
                j += 1;
                (None, b.1.as_ref())
            }
            (None, None) => unreachable!("loop condition"),
        };
        if o.map(|p| p.id) != n.map(|p| p.id) {
            f(o, n);
        }
    }
    if old.direct.map(|p| p.id) != new.direct.map(|p| p.id) {
        f(old.direct, new.direct);
    }
}

/// Computes `old ⊕ new` of every pair of present parts that [`changed_pairs`] reports.
pub(crate) fn deltas<'a>(pairs: impl IntoIterator<Item = (&'a Part, &'a Part)>) -> Deltas {
    let mut out = Deltas::new();
    for (o, n) in pairs {
        out.entry((o.id, n.id))
            .or_insert_with(|| &*o.bits ^ &*n.bits);
    }
    out
}

/// Whether a user's readable set differs between `old` and `new` (`None`: the user does not
/// exist there). Exact. Only documents in some origin's delta can differ, so it probes those
/// one by one and stops at the first that differs; past `budget` probes without an answer it
/// compares the two unions.
pub(crate) fn access_changed(
    old: Option<Lineages<'_>>,
    new: Option<Lineages<'_>>,
    deltas: &Deltas,
    budget: usize,
) -> bool {
    // Parts are never empty bitmaps: a user with a part reads something.
    let (old, new) = match (old, new) {
        (None, None) => return false,
        (Some(o), None) => return o.parts().next().is_some(),
        (None, Some(n)) => return n.parts().next().is_some(),
        (Some(o), Some(n)) => (o, n),
    };
    let mut pairs = Vec::new();
    changed_pairs(old, new, |o, n| pairs.push((o, n)));
    if pairs.is_empty() {
        return false;
    }
    let mut left = budget;
    for (o, n) in pairs {
        let candidates = match (o, n) {
            (Some(o), Some(n)) => deltas.get(&(o.id, n.id)),
            (Some(p), None) | (None, Some(p)) => Some(&*p.bits),
            (None, None) => None,
        };
        let Some(candidates) = candidates else {
            // Not precomputed (a caller's bug): stay exact.
            return unions_differ(old, new);
        };
        for d in candidates {
            if left == 0 {
                return unions_differ(old, new);
            }
            left -= 1;
            if old.reads(d) != new.reads(d) {
                return true;
            }
        }
    }
    false
}

fn unions_differ(old: Lineages<'_>, new: Lineages<'_>) -> bool {
    let union = |l: Lineages<'_>| materialise(None, l.parts().map(|p| &*p.bits));
    union(old) != union(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(docs: &[u32]) -> Part {
        Part::new(docs.iter().copied().collect())
    }

    #[test]
    fn an_edit_gives_a_new_id_and_never_changes_a_shared_bitmap() {
        let mut p = part(&[1, 2]);
        let published = p.clone();
        let id = p.id;
        p.edit().insert(3);
        assert_ne!(p.id, id);
        assert_eq!(published.bits.iter().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(p.bits.iter().collect::<Vec<_>>(), [1, 2, 3]);
        // Not shared any more: edited in place, still a new id.
        let id = p.id;
        p.edit().remove(1);
        assert_ne!(p.id, id);
    }

    #[test]
    fn one_part_is_returned_as_is_and_unions_are_cached_by_part_ids() {
        let cache = AllowCache::new(1 << 20, 16);
        let (a, b) = (part(&[1, 2]), part(&[2, 9]));
        let one = cache.allow_set([&a]);
        assert!(std::ptr::eq(one.bitmap(), &*a.bits));
        assert_eq!(cache.usage().entries, 0);
        let ab = cache.allow_set([&a, &b]);
        assert_eq!(ab.bitmap().iter().collect::<Vec<_>>(), [1, 2, 9]);
        let ba = cache.allow_set([&b, &a]);
        assert!(
            std::ptr::eq(ab.bitmap(), ba.bitmap()),
            "same parts, one set"
        );
        assert_eq!(cache.usage().entries, 1);
        assert!(cache.allow_set([]).is_empty());
    }

    #[test]
    fn the_cache_stays_within_its_byte_and_entry_limits() {
        let parts: Vec<Part> = (0..20u32).map(|i| part(&[i, 100 + i])).collect();
        let one_set = cache_bytes_of(&parts[0], &parts[1]);
        // Room for three sets by bytes, five by entries.
        let cache = AllowCache::new(3 * one_set, 5);
        for w in parts.windows(2) {
            let set = cache.allow_set([&w[0], &w[1]]);
            assert_eq!(set.len(), 4);
            let u = cache.usage();
            assert!(u.bytes <= 3 * one_set && u.entries <= 3, "{u:?}");
        }
        // Held now: (16, 17), (17, 18), (18, 19), oldest first. Use (17, 18), then (16, 17):
        // (18, 19) becomes the least recently used and goes when one more set comes in.
        let s = |i: usize, j: usize| cache.allow_set([&parts[i], &parts[j]]);
        let (s17, s16) = (s(17, 18), s(16, 17));
        s(19, 0);
        assert_eq!(cache.usage().entries, 3);
        assert!(std::ptr::eq(s16.bitmap(), s(16, 17).bitmap()), "kept");
        assert!(std::ptr::eq(s17.bitmap(), s(17, 18).bitmap()), "kept");
        // Entry limit.
        let cache = AllowCache::new(usize::MAX, 2);
        for w in parts.windows(2) {
            cache.allow_set([&w[0], &w[1]]);
            assert!(cache.usage().entries <= 2);
        }
        // A set above the byte budget is returned but never kept.
        let cache = AllowCache::new(one_set - 1, 8);
        assert_eq!(cache.allow_set([&parts[0], &parts[1]]).len(), 4);
        assert_eq!(cache.usage(), CacheUse::default());
    }

    fn cache_bytes_of(a: &Part, b: &Part) -> usize {
        materialise(None, [&*a.bits, &*b.bits]).serialized_size()
    }
}
