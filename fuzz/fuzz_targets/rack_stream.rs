//! `cargo fuzz run rack_stream`: the harness is `airlock::fuzzing::rack_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock::fuzzing::rack_stream(data));
