//! `cargo fuzz run vector_graph_dump`: the harness is `airlock_retrieval::fuzzing::vector_graph_dump`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| airlock_retrieval::fuzzing::vector_graph_dump(data));
