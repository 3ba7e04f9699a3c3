//! Start-up against a real signed bundle: build one from the staged models (MiniLM + SmolLM2),
//! install it with the bundle store, and open the appliance exactly as `airlock serve` does.
//! A tampered install or a missing keyring is refused with a clear message.

use airlock::Config;
use airlock::startup::{self, StartupError};
use airlock_bundle::{BuildOptions, InstallOptions, NoProgress, Store};
use airlock_signing::{KeyPair, Keyring};

use crate::support::small_staging;

#[test]
fn serves_only_a_verified_bundle() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    small_staging(&staging);
    let key = KeyPair::generate();
    let bundle = tmp.path().join("b.tar.zst");
    airlock_bundle::build(
        &staging,
        &BuildOptions::new("airlock-test", "1.2.3".parse().unwrap()),
        &[&key],
        &bundle,
        &NoProgress,
    )
    .unwrap();
    let data = tmp.path().join("data");
    let config = Config {
        data: Some(data.clone()),
        ..Config::default()
    };

    // No keyring pinned yet: refused.
    let err = startup::open(&config)
        .err()
        .expect("no keyring must refuse");
    assert!(matches!(err, StartupError::Keyring { .. }), "{err}");

    let keyring = Keyring::new(1, &[key.public()]).unwrap();
    std::fs::create_dir_all(data.join("keys")).unwrap();
    keyring.save(&data.join("keys/trusted.json")).unwrap();

    // Pinned keyring, nothing installed: refused.
    let err = startup::open(&config).err().expect("no bundle must refuse");
    assert!(err.to_string().starts_with("refusing to serve"), "{err}");

    Store::open(&data)
        .unwrap()
        .install(&bundle, &keyring, &InstallOptions::default())
        .unwrap();
    let services = startup::open(&config).expect("verified bundle opens");
    assert_eq!(services.bundle_version(), "1.2.3");
    let aliases: Vec<&str> = services.catalogue.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(aliases, ["airlock-embed", "airlock-small"]);
    assert_eq!(services.generators.len(), 1);
    assert_eq!(services.default_generator().unwrap().alias, "airlock-small");
    drop(services);

    // Tamper with an installed file: refused, naming the bundle problem.
    let installed = data.join("bundles/1.2.3/smollm2/chat_template.jinja");
    let mut text = std::fs::read_to_string(&installed).unwrap();
    text.push_str("{# tampered #}");
    std::fs::remove_file(&installed).unwrap(); // break the hard link to the staging copy
    std::fs::write(&installed, text).unwrap();
    let err = startup::open(&config)
        .err()
        .expect("tampered bundle must refuse");
    let msg = err.to_string();
    assert!(matches!(err, StartupError::Bundle { .. }), "{msg}");
    assert!(msg.starts_with("refusing to serve"), "{msg}");
}
