//! `cargo fuzz run ingest_html`: the harness is `airlock_retrieval::fuzzing::ingest_html`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_retrieval::fuzzing::ingest_html(data));
