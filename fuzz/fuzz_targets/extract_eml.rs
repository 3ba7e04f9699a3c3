//! `cargo fuzz run extract_eml`: the harness is `airlock_extract::fuzzing::extract_eml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_extract::fuzzing::extract_eml(data));
