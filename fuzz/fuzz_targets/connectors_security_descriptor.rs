//! `cargo fuzz run connectors_security_descriptor`: the harness is
//! `airlock_connectors::fuzzing::security_descriptor` (a file server's self-relative security
//! descriptor bytes).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_connectors::fuzzing::security_descriptor(data));
