//! hdf5 utilities for examples

pub mod annhdf5;
