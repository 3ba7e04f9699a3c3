//! `cargo fuzz run extract_pdf`: the harness is `airlock_extract::fuzzing::extract_pdf`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_extract::fuzzing::extract_pdf(data));
