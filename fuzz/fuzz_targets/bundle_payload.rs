//! `cargo fuzz run bundle_payload`: the harness is `airlock_bundle::fuzzing::bundle_payload`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_bundle::fuzzing::bundle_payload(data));
