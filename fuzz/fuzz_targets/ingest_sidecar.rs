//! `cargo fuzz run ingest_sidecar`: the harness is `airlock_retrieval::fuzzing::ingest_sidecar`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_retrieval::fuzzing::ingest_sidecar(data));
