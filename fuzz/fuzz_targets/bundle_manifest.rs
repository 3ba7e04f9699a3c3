//! `cargo fuzz run bundle_manifest`: the harness is `airlock_bundle::fuzzing::bundle_manifest`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_bundle::fuzzing::bundle_manifest(data));
