//! `cargo fuzz run chat_body`: the harness is `airlock::fuzzing::chat_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock::fuzzing::chat_body(data));
