//! `cargo fuzz run backup_archive`: the harness is `airlock::fuzzing::backup_archive`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock::fuzzing::backup_archive(data));
