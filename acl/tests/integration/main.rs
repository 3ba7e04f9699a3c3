//! Integration tests of `airlock-acl` against real SQLite files (and the bank-dev dataset).

mod audit;
mod bank;
mod common;
mod concurrency;
mod grants;
mod props;
mod roles;
mod tokens;
