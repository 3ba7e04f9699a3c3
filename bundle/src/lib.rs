//! `airlock-bundle`: the bundle format (`tar.zst` with a signed manifest), deterministic build,
//! streaming verify with hard limits, and the install store (current/previous, rollback floor).
//! It knows nothing of models: the model catalogue is opaque data in the manifest.
#![warn(missing_docs)]
