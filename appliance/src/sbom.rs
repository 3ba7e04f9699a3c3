//! The software bill of materials of this `airlock` binary, as CycloneDX 1.5 JSON.
//!
//! `build.rs` derived the component list while this binary was built (the crates linked into
//! it: no dev-dependencies, no build-time tools or procedural macros), with each crate's
//! version, licence and Cargo.lock SHA-256. `airlock bundle build` writes the document into
//! every bundle as [`SBOM_PATH`] (listed and digested in the signed manifest like any file);
//! `airlock bundle sbom` prints it. The document is deterministic (no timestamp, no random
//! serial number), so reproducible bundle builds stay byte-identical.

use serde_json::{Value, json};

/// Where the SBOM sits inside a bundle.
pub const SBOM_PATH: &str = "sbom.cdx.json";

/// Tab-separated rows: name, version, kind (`registry` / `workspace` / `other`), licence
/// (SPDX expression, may be empty), Cargo.lock checksum (registry crates).
const COMPONENTS: &str = include_str!(concat!(env!("OUT_DIR"), "/sbom-components.tsv"));

/// One crate linked into the binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    /// Crate name.
    pub name: String,
    /// Crate version (as in Cargo.lock).
    pub version: String,
    /// `registry` (crates.io), `workspace` (this repository) or `other`.
    pub kind: String,
    /// SPDX licence expression from the crate's manifest (empty if it declares none).
    pub licence: String,
    /// SHA-256 of the `.crate` file from Cargo.lock (empty for workspace crates).
    pub sha256: String,
}

impl Component {
    /// The package URL, `pkg:cargo/NAME@VERSION`.
    pub fn purl(&self) -> String {
        format!("pkg:cargo/{}@{}", self.name, self.version)
    }
}

/// Every crate linked into this binary, sorted by name and version.
pub fn components() -> Vec<Component> {
    COMPONENTS
        .lines()
        .filter_map(|line| {
            let mut f = line.split('\t');
            Some(Component {
                name: f.next()?.to_owned(),
                version: f.next()?.to_owned(),
                kind: f.next()?.to_owned(),
                licence: f.next().unwrap_or("").to_owned(),
                sha256: f.next().unwrap_or("").to_owned(),
            })
        })
        .collect()
}

fn component_json(c: &Component) -> Value {
    let mut v = json!({
        "type": if c.kind == "workspace" && c.name == "airlock" { "application" } else { "library" },
        "bom-ref": c.purl(),
        "name": c.name,
        "version": c.version,
        "purl": c.purl(),
    });
    if !c.licence.is_empty() {
        v["licenses"] = json!([{ "expression": c.licence }]);
    }
    if !c.sha256.is_empty() {
        v["hashes"] = json!([{ "alg": "SHA-256", "content": c.sha256 }]);
    }
    if c.kind == "workspace" {
        v["properties"] = json!([{ "name": "airlock:source", "value": "workspace" }]);
    }
    v
}

/// The CycloneDX 1.5 document (pretty JSON with a trailing newline).
pub fn cyclonedx() -> Vec<u8> {
    let all = components();
    let me = all
        .iter()
        .find(|c| c.name == "airlock" && c.kind == "workspace")
        .cloned()
        .unwrap_or(Component {
            name: "airlock".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            kind: "workspace".into(),
            licence: String::new(),
            sha256: String::new(),
        });
    let doc = json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "component": component_json(&me),
            "properties": [{
                "name": "airlock:scope",
                "value": "crates linked into the airlock binary (cargo tree -e normal,no-proc-macro \
                          for its target); build-time tools, procedural macros and \
                          dev-dependencies are not listed",
            }],
        },
        "components": all
            .iter()
            .filter(|c| c.name != me.name || c.version != me.version)
            .map(component_json)
            .collect::<Vec<_>>(),
    });
    let mut out = serde_json::to_vec_pretty(&doc).expect("serialising the SBOM");
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_list_has_the_linked_crates_and_no_build_tools() {
        let all = components();
        let find = |n: &str| all.iter().find(|c| c.name == n);
        for name in ["tantivy", "axum", "rusqlite", "ed25519-dalek", "zstd"] {
            let c = find(name).unwrap_or_else(|| panic!("{name} missing"));
            assert_eq!(c.kind, "registry");
            assert_eq!(c.sha256.len(), 64, "{name}: {c:?}");
            assert!(!c.licence.is_empty(), "{name}: {c:?}");
        }
        assert_eq!(find("airlock-bundle").unwrap().kind, "workspace");
        // Dev-dependencies (tempfile, proptest) and proc macros (serde_derive) are not linked.
        for absent in ["proptest", "criterion", "serde_derive", "thiserror-impl"] {
            assert!(find(absent).is_none(), "{absent} is not linked");
        }
    }
}
