//! `cargo fuzz run rack_metrics`: the harness is `airlock::fuzzing::rack_metrics`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock::fuzzing::rack_metrics(data));
