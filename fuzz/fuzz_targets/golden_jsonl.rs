//! `cargo fuzz run golden_jsonl`: the harness is `airlock_eval::fuzzing::golden_jsonl`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_eval::fuzzing::golden_jsonl(data));
