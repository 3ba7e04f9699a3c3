//! `cargo fuzz run console_report`: the harness is `airlock::fuzzing::console_report`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock::fuzzing::console_report(data));
