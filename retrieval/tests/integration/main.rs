//! Integration tests of `airlock-retrieval`: real SQLite, real tantivy, real files.

mod common;
mod crash;
mod engine;
mod ingest;
mod leak;
mod property;
mod vector;
