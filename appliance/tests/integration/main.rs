//! Integration tests of the `airlock` crate (one binary for link time).

mod api;
mod audit;
mod bundle_cli;
mod chat;
mod conversations;
mod e2e;
mod eval;
mod export;
mod feedback;
mod focus;
mod http;
mod ingest_crash;
mod ladder;
mod ldap;
mod llama_server;
mod purge;
mod rack;
mod refusals;
mod roles;
mod sandbox;
mod slapd;
mod sso_proxy;
mod startup;
mod support;
mod timing;
mod tls;
