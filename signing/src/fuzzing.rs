//! Fuzz harnesses (not API). Each `pub fn` takes arbitrary bytes and must never panic: a panic
//! is a finding. The same bodies run under `cargo fuzz` (`fuzz/fuzz_targets/keyring_json.rs`)
//! and as plain tests over `fuzz/corpus/keyring_json/`, `fuzz/regressions/keyring_json/` and
//! proptest mutations of them (the tests below).

use std::sync::OnceLock;

use crate::{Error, KeyPair, Keyring, Purpose, SignatureEnvelope, SignedKeyring};

/// The current keyring a fuzzed rotation is offered to: keys from seeds `[1; 32]`..`[3; 32]`,
/// threshold 2 (the corpus rotation is signed by the first two).
pub fn rotation_base() -> &'static Keyring {
    static RING: OnceLock<Keyring> = OnceLock::new();
    RING.get_or_init(|| {
        let keys: Vec<_> = (1..=3u8)
            .map(|i| KeyPair::from_seed([i; 32]).public())
            .collect();
        Keyring::new(2, &keys).expect("rotation base keyring")
    })
}

/// Target `keyring_json`: `data` is parsed as each of the crate's JSON documents, a keyring, a
/// signature envelope and a signed keyring (rotation), as the CLI and the daemon load them.
///
/// Invariants: a parsed keyring satisfies the documented invariants and re-serialises to JSON
/// that parses to an equal keyring; a parsed envelope round-trips and every signature decodes;
/// an accepted rotation is newer than the current keyring and was signed by a threshold of it;
/// every refusal of a document is [`Error::Malformed`] (a verdict on the input).
pub fn keyring_json(data: &[u8]) {
    match Keyring::from_json(data) {
        Ok(ring) => {
            assert!(ring.threshold() >= 1);
            assert!(ring.keys().len() >= ring.threshold() as usize);
            for k in ring.keys() {
                assert_eq!(k.public_key.key_id(), k.key_id);
                assert!(ring.is_trusted(&k.key_id));
            }
            assert!(ring.revoked().iter().all(|r| !ring.is_trusted(r)));
            let again = Keyring::from_json(&ring.to_json()).expect("a keyring's own JSON parses");
            assert_eq!(again, ring, "keyring JSON round trip");
            assert_eq!(
                again.to_json(),
                ring.to_json(),
                "serialisation is canonical"
            );
        }
        Err(e) => assert!(matches!(e, Error::Malformed { .. }), "keyring: {e:?}"),
    }

    match SignatureEnvelope::from_json(data) {
        Ok(env) => {
            for s in &env.signatures {
                s.signature_bytes()
                    .expect("an accepted envelope's signatures decode");
            }
            let again = SignatureEnvelope::from_json(&env.to_json()).expect("own JSON parses");
            assert_eq!(again, env, "envelope JSON round trip");
        }
        Err(e) => assert!(matches!(e, Error::Malformed { .. }), "envelope: {e:?}"),
    }

    // `SignedKeyring::load` is `serde_json::from_slice` on the file's bytes.
    if let Ok(signed) = serde_json::from_slice::<SignedKeyring>(data) {
        let current = rotation_base();
        if let Ok(next) = signed.accept(current) {
            assert!(next.version() > current.version(), "rotation must be newer");
            let text = serde_json::to_value(&signed).expect("signed keyring serialises");
            let keyring_text = text["keyring"].as_str().expect("keyring text");
            let envelope: SignatureEnvelope =
                serde_json::from_value(text["signatures"].clone()).expect("envelope");
            let signers = current
                .verify(Purpose::Keyring, keyring_text.as_bytes(), &envelope)
                .expect("an accepted rotation's signatures verify again");
            assert!(signers.len() >= current.threshold() as usize);
            assert_eq!(Keyring::from_json(keyring_text.as_bytes()).unwrap(), next);
        }
    }
}

#[cfg(test)]
#[path = "../../fuzz/replay.rs"]
mod replay;

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> KeyPair {
        KeyPair::from_seed([i; 32])
    }

    /// A keyring with a revoked key, an envelope and an accepted rotation of [`rotation_base`].
    fn seeds() -> Vec<Vec<u8>> {
        let mut ring = Keyring::new(1, &[key(1).public(), key(2).public()]).unwrap();
        ring.revoke(&key(2).key_id()).unwrap();
        let env = SignatureEnvelope::new(vec![
            key(1).sign(Purpose::Manifest, b"m"),
            key(2).sign(Purpose::Manifest, b"m"),
        ]);
        let mut next = rotation_base().clone();
        next.add_key(key(4).public()).unwrap();
        next.revoke(&key(3).key_id()).unwrap();
        let signed = SignedKeyring::sign(&next, &[&key(1), &key(2)]);
        assert_eq!(signed.accept(rotation_base()).unwrap(), next);
        vec![
            ring.to_json(),
            env.to_json(),
            serde_json::to_vec_pretty(&signed).unwrap(),
        ]
    }

    #[test]
    fn keyring_json_corpus_and_mutations() {
        replay::run("keyring_json", &seeds(), 4000, keyring_json);
    }

    /// Writes the seed corpus files (`cargo test -p airlock-signing -- --ignored write_seeds`).
    #[test]
    #[ignore = "regenerates fuzz/corpus seeds"]
    fn write_seeds() {
        for (name, bytes) in ["keyring.json", "envelope.json", "rotation.json"]
            .iter()
            .zip(seeds())
        {
            replay::write_seed("keyring_json", name, &bytes);
        }
    }
}
