//! The workspace's dependency direction (issue 44, ARCHITECTURE.md "Dependency direction"),
//! read from `cargo metadata --format-version 1 --no-deps`:
//!
//! - every dependency of a workspace crate on another workspace crate (normal, build or dev)
//!   is an edge of [`ALLOWED`] (a crate may name itself, for its own test features);
//! - nothing depends on `airlock`, the binary that wires everything together;
//! - the HTTP server stack (axum and its tower layers) is a dependency of [`HTTP_CRATES`] only:
//!   the libraries return their own errors and know nothing of routes or status codes;
//! - the hyper client stack (hyper, hyper-util, http-body-util) is named by [`HTTP_CRATES`] and
//!   by [`EGRESS_CRATES`] only: `airlock-platform` holds the one egress HTTP client
//!   (`platform::egress`, to the bank's inference rack and its OpenID provider) behind
//!   its own request and response types over the plain `http` types and `bytes`, so its users
//!   (`airlock-serving`'s remote generators) name neither hyper nor axum. The `http` crate's
//!   types are not a stack and are allowed anywhere;
//! - every workspace crate is in [`ALLOWED`], so a new crate has to be placed in the table.
//!
//! A new edge is a design decision: add it here and to ARCHITECTURE.md in the same change.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Each workspace crate and the workspace crates it may depend on.
const ALLOWED: &[(&str, &[&str])] = &[
    // Leaves.
    ("airlock-platform", &[]),
    ("airlock-signing", &[]),
    ("airlock-acl", &[]),
    ("airlock-extract", &[]),
    ("airlock-text", &[]),
    ("airlock-inference", &[]),
    ("hnsw_rs", &[]),
    // Connectors to the bank's sources (SMB shares, Active Directory): a leaf; the daemon
    // (`airlock`) drives them and writes through its own document + grant path.
    ("airlock-connectors", &[]),
    // Libraries over leaves.
    ("airlock-identity", &["airlock-acl", "airlock-platform"]),
    ("airlock-bundle", &["airlock-signing"]),
    (
        "airlock-retrieval",
        &["airlock-acl", "airlock-extract", "hnsw_rs"],
    ),
    (
        "airlock-evidence",
        &[
            "airlock-acl",
            "airlock-platform",
            "airlock-signing",
            "airlock-text",
        ],
    ),
    ("airlock-eval", &["airlock-signing", "airlock-text"]),
    (
        "airlock-rag",
        &["airlock-acl", "airlock-retrieval", "airlock-text"],
    ),
    // What serves an answer (admission, the ladder, quotas, the generators local and on the
    // rack, the answer core): over the libraries it drives, never the binary.
    (
        "airlock-serving",
        &[
            "airlock-platform",
            "airlock-identity",
            "airlock-evidence",
            "airlock-signing",
            "airlock-acl",
            "airlock-retrieval",
            "airlock-inference",
            "airlock-rag",
            "airlock-text",
        ],
    ),
    // The binary (and, until the server crate exists, the HTTP layer): may use every library.
    (
        "airlock",
        &[
            "airlock-platform",
            "airlock-identity",
            "airlock-evidence",
            "airlock-bundle",
            "airlock-signing",
            "airlock-acl",
            "airlock-retrieval",
            "airlock-inference",
            "airlock-eval",
            "airlock-rag",
            "airlock-text",
            "airlock-extract",
            "airlock-connectors",
            "airlock-serving",
        ],
    ),
];

/// The only crates that may name an HTTP stack (server or client).
const HTTP_CRATES: &[&str] = &["airlock"];

/// Crates that may also name the hyper client stack ([`HTTP_CLIENT_STACK`]): the leaf that holds
/// the egress HTTP client.
const EGRESS_CRATES: &[&str] = &["airlock-platform"];

/// Dependencies that are an HTTP server stack: the binary's only.
const HTTP_SERVER_STACK: &[&str] = &["axum", "tower", "tower-http"];

/// Dependencies that are the hyper client stack: the binary's and [`EGRESS_CRATES`]'.
const HTTP_CLIENT_STACK: &[&str] = &["hyper", "hyper-util", "http-body-util"];

/// The binary: nothing may depend on it.
const BINARY: &str = "airlock";

/// Workspace crate name → (dependency name, kind) of each of its dependencies.
fn metadata() -> BTreeMap<String, Vec<(String, String)>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
            "--manifest-path",
            manifest,
        ])
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut crates = BTreeMap::new();
    for p in doc["packages"].as_array().unwrap() {
        let deps = p["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["name"].as_str().unwrap().to_owned(),
                    d["kind"].as_str().unwrap_or("normal").to_owned(),
                )
            })
            .collect();
        crates.insert(p["name"].as_str().unwrap().to_owned(), deps);
    }
    crates
}

#[test]
fn workspace_crates_depend_only_along_the_allowed_edges() {
    let crates = metadata();
    let allowed: BTreeMap<&str, BTreeSet<&str>> = ALLOWED
        .iter()
        .map(|(c, deps)| (*c, deps.iter().copied().collect()))
        .collect();
    let members: BTreeSet<&str> = crates.keys().map(String::as_str).collect();
    let unplaced: Vec<&&str> = members
        .iter()
        .filter(|c| !allowed.contains_key(**c))
        .collect();
    assert!(
        unplaced.is_empty(),
        "workspace crates missing from ALLOWED (place them in the direction): {unplaced:?}"
    );
    let mut wrong = Vec::new();
    for (name, deps) in &crates {
        for (dep, kind) in deps {
            if !members.contains(dep.as_str()) || dep == name {
                continue;
            }
            if dep == BINARY {
                wrong.push(format!(
                    "{name} -> {dep} ({kind}): nothing depends on the binary"
                ));
            } else if !allowed[name.as_str()].contains(dep.as_str()) {
                wrong.push(format!("{name} -> {dep} ({kind}): not an allowed edge"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependency direction broken:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn only_the_http_crates_know_an_http_stack() {
    let crates = metadata();
    let mut wrong = Vec::new();
    for (name, deps) in &crates {
        if HTTP_CRATES.contains(&name.as_str()) {
            continue;
        }
        let egress = EGRESS_CRATES.contains(&name.as_str());
        for (dep, kind) in deps {
            let server = HTTP_SERVER_STACK.contains(&dep.as_str());
            let client = HTTP_CLIENT_STACK.contains(&dep.as_str());
            if server || client && !egress {
                wrong.push(format!("{name} -> {dep} ({kind})"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "HTTP stacks outside {HTTP_CRATES:?} (hyper's client also in {EGRESS_CRATES:?}):\n{}",
        wrong.join("\n")
    );
}
