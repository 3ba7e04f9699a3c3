//! `cargo fuzz run extract_xlsx`: the harness is `airlock_extract::fuzzing::extract_xlsx`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_extract::fuzzing::extract_xlsx(data));
