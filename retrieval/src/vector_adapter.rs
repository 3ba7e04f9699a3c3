//! Connects [`crate::vector`]'s index to the engine's [`DenseIndex`] seam.

use std::path::Path;

use crate::dense::DenseIndex;
use crate::error::Result;

/// Opens the vector index of one generation directory.
pub(crate) fn open(_dir: &Path, _dim: usize) -> Result<Option<Box<dyn DenseIndex>>> {
    // The int8 index (crate::vector) is not in the tree yet: vector modes report
    // `VectorUnavailable` until it is wired here.
    Ok(None)
}
