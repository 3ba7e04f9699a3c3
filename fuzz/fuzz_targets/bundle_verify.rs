//! `cargo fuzz run bundle_verify`: the harness is `airlock_bundle::fuzzing::bundle_verify`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_bundle::fuzzing::bundle_verify(data));
