//! `airlock`: the appliance. CLI, config, daemon wiring, HTTP API, auth, admission and the
//! degradation ladder, metrics, web UI assets and egress lockdown. The only crate that wires the
//! other crates together.
#![warn(missing_docs)]

pub mod cli;
