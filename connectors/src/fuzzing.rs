//! Harnesses for `cargo fuzz` (fuzz/fuzz_targets/connectors_security_descriptor.rs) and for
//! the corpus replay under `cargo test` (fuzz/replay.rs).

/// Parses `data` as a self-relative security descriptor; when it parses, the access check runs
/// over it and the re-encoded form must parse to the same allow/deny ACEs.
pub fn security_descriptor(data: &[u8]) {
    let Ok(sd) = crate::sd::parse(data) else {
        return;
    };
    let token: std::collections::BTreeSet<_> = [crate::sid::well_known::everyone()].into();
    let granted = crate::access::is_granted(&sd, &token, crate::access::FILE_READ_DATA);
    let again = crate::sd::parse(&crate::sd::to_bytes(&sd)).expect("re-encoded descriptor parses");
    assert_eq!(again.owner, sd.owner);
    assert_eq!(again.dacl.is_some(), sd.dacl.is_some());
    // Dropping ACE kinds the encoder does not write can only remove grants and denies of
    // unevaluated kinds; for plain allow/deny DACLs the verdict is the same.
    let plain = sd.dacl.as_ref().is_none_or(|a| {
        a.aces
            .iter()
            .all(|e| matches!(e.kind, crate::sd::AceKind::Allow | crate::sd::AceKind::Deny))
    });
    if plain {
        assert_eq!(
            crate::access::is_granted(&again, &token, crate::access::FILE_READ_DATA),
            granted
        );
    }
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sd::{Ace, SecurityDescriptor, to_bytes};
    use crate::sid::well_known;

    fn seeds() -> Vec<Vec<u8>> {
        let d: crate::sid::Sid = "S-1-5-21-10-20-30-1104".parse().unwrap();
        let mut owned = SecurityDescriptor::with_dacl(Some(vec![
            Ace::deny(d.clone(), 0, 0x1),
            Ace::allow(well_known::everyone(), 0x3, 0x8000_0000),
            Ace::allow(well_known::creator_owner(), 0xb, 0x1f01ff),
        ]));
        owned.owner = Some(well_known::builtin_administrators());
        owned.group = Some(d);
        vec![
            to_bytes(&owned),
            to_bytes(&SecurityDescriptor::with_dacl(None)),
            to_bytes(&SecurityDescriptor::with_dacl(Some(vec![]))),
        ]
    }

    #[test]
    fn security_descriptor_corpus_and_mutations() {
        replay::run(
            "connectors_security_descriptor",
            &seeds(),
            3000,
            security_descriptor,
        );
    }

    #[test]
    #[ignore = "writes fuzz/corpus/connectors_security_descriptor/"]
    fn write_seeds() {
        for (i, s) in seeds().iter().enumerate() {
            replay::write_seed(
                "connectors_security_descriptor",
                &format!("seed-{i}.bin"),
                s,
            );
        }
    }
}
