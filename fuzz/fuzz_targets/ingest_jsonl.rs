//! `cargo fuzz run ingest_jsonl`: the harness is `airlock_retrieval::fuzzing::ingest_jsonl`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_retrieval::fuzzing::ingest_jsonl(data));
