//! `cargo fuzz run keyring_json`: the harness is `airlock_signing::fuzzing::keyring_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_signing::fuzzing::keyring_json(data));
