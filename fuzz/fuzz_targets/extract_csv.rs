//! `cargo fuzz run extract_csv`: the harness is `airlock_extract::fuzzing::extract_csv`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_extract::fuzzing::extract_csv(data));
