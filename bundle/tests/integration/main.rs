//! Integration tests of `airlock-bundle`: real `tar.zst` files, built by the builder or crafted
//! byte by byte to break exactly one rule.

mod common;
mod compat;
mod flips;
mod refusals;
mod roundtrip;
mod store;
