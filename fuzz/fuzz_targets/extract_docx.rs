//! `cargo fuzz run extract_docx`: the harness is `airlock_extract::fuzzing::extract_docx`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_extract::fuzzing::extract_docx(data));
