//! `cargo fuzz run extract_pptx`: the harness is `airlock_extract::fuzzing::extract_pptx`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_extract::fuzzing::extract_pptx(data));
