//! `cargo fuzz run eval_export`: the harness is `airlock_eval::fuzzing::eval_export`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_eval::fuzzing::eval_export(data));
