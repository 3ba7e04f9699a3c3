//! `cargo fuzz run acl_snapshot`: the harness is `airlock_acl::fuzzing::acl_snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_acl::fuzzing::acl_snapshot(data));
