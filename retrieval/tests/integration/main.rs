//! Integration tests of `airlock-retrieval`: real SQLite, real tantivy, real files.

mod vector;
