//! `cargo fuzz run answer_receipt`: the harness is `airlock::fuzzing::answer_receipt`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock::fuzzing::answer_receipt(data));
