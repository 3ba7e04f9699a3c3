//! Start-up against a real signed bundle: build one from the staged models (MiniLM + SmolLM2),
//! install it with the bundle store, and open the appliance exactly as `airlock serve` does.
//! A tampered install or a missing keyring is refused with a clear message. A bundle that
//! carries a cross-encoder gets the rerank stage at rung 0.

use airlock::Config;
use airlock::startup::{self, StartupError};
use airlock_bundle::{BuildOptions, InstallOptions, NoProgress, Store};
use airlock_signing::{KeyPair, Keyring};

use std::collections::HashMap;
use std::path::Path;

use airlock_inference::{CrossEncoder, CrossEncoderConfig, CrossEncoderFiles};
use axum::http::{Method, StatusCode};
use candle_core::{Device, Tensor};
use serde_json::{Value, json};

use crate::support::{TestApp, models_dir, small_staging, test_config};

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
    // What receipts name: the signed manifest's digest and the weights' digest it pins.
    let manifest = std::fs::read(data.join("bundles/1.2.3/manifest.json")).unwrap();
    assert_eq!(
        services.bundle_digest(),
        Some(airlock_evidence::receipts::sha256(&manifest).as_str())
    );
    let m: Value = serde_json::from_slice(&manifest).unwrap();
    let gguf = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"].as_str().unwrap().ends_with("model.gguf"))
        .unwrap();
    assert_eq!(
        services.default_generator().unwrap().file_digest,
        Some(format!("sha256:{}", gguf["sha256"].as_str().unwrap()))
    );
    // No appliance key (the store installed the bundle, not `airlock install`): served
    // without one, receipts unsigned until it exists.
    assert!(services.appliance_key.is_none());
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

#[test]
fn a_running_binary_other_than_the_bundles_signed_one_is_refused_or_warned_per_config() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    small_staging(&staging);
    // The bundle carries an appliance binary that is not this (test) executable.
    let other = tmp.path().join("airlock-other");
    std::fs::write(&other, b"\x7fELF another build of airlock").unwrap();
    let key = KeyPair::generate();
    let bundle = tmp.path().join("b.tar.zst");
    let mut options = BuildOptions::new("airlock-test", "2.0.0".parse().unwrap());
    options.binary = Some(other.clone());
    airlock_bundle::build(&staging, &options, &[&key], &bundle, &NoProgress).unwrap();
    let data = tmp.path().join("data");
    let keyring = Keyring::new(1, &[key.public()]).unwrap();
    std::fs::create_dir_all(data.join("keys")).unwrap();
    keyring.save(&data.join("keys/trusted.json")).unwrap();
    Store::open(&data)
        .unwrap()
        .install(&bundle, &keyring, &InstallOptions::default())
        .unwrap();
    let state_before = std::fs::read(data.join("bundles/state.json")).ok();

    // Default: refused, naming both digests and the bundle's own binary.
    let config = Config {
        data: Some(data.clone()),
        ..Config::default()
    };
    let err = startup::open(&config)
        .err()
        .expect("another binary must refuse");
    let msg = err.to_string();
    assert!(matches!(err, StartupError::BinaryMismatch { .. }), "{msg}");
    let signed = startup::sha256_file(&other).unwrap();
    let mine = startup::sha256_file(&std::env::current_exe().unwrap()).unwrap();
    assert!(
        msg.starts_with("refusing to serve")
            && msg.contains(&signed)
            && msg.contains(&mine)
            && msg.contains("bundles/2.0.0/bin/airlock"),
        "{msg}"
    );
    // A refused start changes nothing.
    assert_eq!(
        std::fs::read(data.join("bundles/state.json")).ok(),
        state_before
    );

    // `binary_check = "warn"`: it starts.
    let config = Config {
        data: Some(data.clone()),
        binary_check: Some(airlock::config::BinaryCheck::Warn),
        ..Config::default()
    };
    let services = startup::open(&config).expect("warn starts");
    assert_eq!(services.bundle_version(), "2.0.0");
}

#[test]
fn start_up_checks_the_pinned_keyring_only_and_never_moves_the_floor() {
    // Issue 19 F5. A rogue bundle (signed by a key the appliance never trusted) sits installed,
    // as the old `install --keyring FILE` left it. Start-up refuses it, with or without
    // `--keyring` of the rogue key set, and writes nothing: the rollback floor stays.
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(
        src.join("README.txt"),
        "no models needed: refused before loading",
    )
    .unwrap();
    let (trusted, rogue) = (KeyPair::generate(), KeyPair::generate());
    let bundle = tmp.path().join("rogue.tar.zst");
    airlock_bundle::build(
        &src,
        &BuildOptions::new("rogue", "999.0.0".parse().unwrap()),
        &[&rogue],
        &bundle,
        &NoProgress,
    )
    .unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("keys")).unwrap();
    Keyring::new(1, &[trusted.public()])
        .unwrap()
        .save(&data.join("keys/trusted.json"))
        .unwrap();
    let rogue_ring = Keyring::new(1, &[rogue.public()]).unwrap();
    let rogue_ring_path = tmp.path().join("rogue-ring.json");
    rogue_ring.save(&rogue_ring_path).unwrap();
    Store::open(&data)
        .unwrap()
        .install(&bundle, &rogue_ring, &InstallOptions::default())
        .unwrap();
    let state_path = data.join("bundles/state.json");
    let before = std::fs::read(&state_path).unwrap();

    let pinned_only = Config {
        data: Some(data.clone()),
        ..Config::default()
    };
    let err = startup::verify_bundle(&pinned_only)
        .err()
        .expect("a bundle the pinned keyring does not trust must refuse");
    assert!(matches!(err, StartupError::Bundle { .. }), "{err}");
    assert!(err.to_string().contains("unknown key"), "{err}");
    assert_eq!(
        std::fs::read(&state_path).unwrap(),
        before,
        "floor unchanged"
    );

    let overridden = Config {
        data: Some(data.clone()),
        keyring: Some(rogue_ring_path),
        ..Config::default()
    };
    let err = startup::verify_bundle(&overridden)
        .err()
        .expect("--keyring must not replace the pinned keyring");
    assert!(
        matches!(err, StartupError::KeyringNotPinned { .. }),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&state_path).unwrap(),
        before,
        "floor unchanged"
    );

    // Naming the pinned file itself is accepted (and still refuses the rogue bundle).
    let same = Config {
        data: Some(data.clone()),
        keyring: Some(data.join("keys/../keys/trusted.json")),
        ..Config::default()
    };
    let err = startup::verify_bundle(&same).err().unwrap();
    assert!(matches!(err, StartupError::Bundle { .. }), "{err}");
}

/// A MiniLM-shaped cross-encoder: the staged MiniLM encoder with a generated pooler and
/// classifier head (deterministic weights: the scores mean nothing, but they are this model's).
fn write_cross_encoder(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let minilm = models_dir().join("minilm");
    let mut tensors: HashMap<String, Tensor> =
        candle_core::safetensors::load(minilm.join("model.safetensors"), &Device::Cpu).unwrap();
    let pattern = |n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|i| scale * ((i * 7919 % 1000) as f32 / 500.0 - 1.0))
            .collect()
    };
    let put = |t: &mut HashMap<String, Tensor>, name: &str, v: Vec<f32>, shape: &[usize]| {
        t.insert(
            name.into(),
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap(),
        );
    };
    put(
        &mut tensors,
        "pooler.dense.weight",
        pattern(384 * 384, 0.05),
        &[384, 384],
    );
    put(&mut tensors, "pooler.dense.bias", vec![0.0; 384], &[384]);
    put(
        &mut tensors,
        "classifier.weight",
        pattern(384, 0.5),
        &[1, 384],
    );
    put(&mut tensors, "classifier.bias", vec![0.1], &[1]);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(minilm.join(f), dir.join(f)).unwrap();
    }
}

/// Stages MiniLM + SmolLM2 plus `reranker` (a catalogue entry; `ce/` holds a generated
/// cross-encoder), builds, signs and installs the bundle under `tmp`, and opens it as
/// `airlock serve` does.
fn open_with_reranker(
    tmp: &Path,
    reranker: Value,
) -> Result<airlock::Services, startup::StartupError> {
    let staging = tmp.join("staging");
    small_staging(&staging);
    write_cross_encoder(&staging.join("ce"));
    let cat_path = staging.join("catalogue.json");
    let mut cat: Vec<Value> = serde_json::from_slice(&std::fs::read(&cat_path).unwrap()).unwrap();
    cat.push(reranker);
    std::fs::write(&cat_path, serde_json::to_vec_pretty(&cat).unwrap()).unwrap();
    let key = KeyPair::generate();
    let bundle = tmp.join("b.tar.zst");
    airlock_bundle::build(
        &staging,
        &BuildOptions::new("airlock-test", "2.0.0".parse().unwrap()),
        &[&key],
        &bundle,
        &NoProgress,
    )
    .unwrap();
    let data = tmp.join("data");
    let keyring = Keyring::new(1, &[key.public()]).unwrap();
    std::fs::create_dir_all(data.join("keys")).unwrap();
    keyring.save(&data.join("keys/trusted.json")).unwrap();
    Store::open(&data)
        .unwrap()
        .install(&bundle, &keyring, &InstallOptions::default())
        .unwrap();
    startup::open(&Config {
        data: Some(data),
        ..Config::default()
    })
}

#[test]
fn the_demo_fallback_reranker_adds_no_stage_and_unknown_kinds_are_refused() {
    // The demo bundle's entry: the embedder's f32 cosine, which the rescoring stage computes
    // from stored vectors already.
    let tmp = tempfile::tempdir().unwrap();
    let services = open_with_reranker(
        tmp.path(),
        json!({"id": "minilm-cosine-rescore", "role": "reranker", "alias": "airlock-rerank",
            "files": ["minilm/model.safetensors", "minilm/config.json", "minilm/tokenizer.json"],
            "params": {"kind": "bi-encoder-rescore", "embedder": "minilm"}}),
    )
    .expect("the demo's fallback reranker opens");
    assert_eq!(services.retrieval.reranker_name(), None);
    drop(services);

    let tmp = tempfile::tempdir().unwrap();
    let err = open_with_reranker(
        tmp.path(),
        json!({"id": "ce", "role": "reranker", "alias": "airlock-rerank",
            "files": ["ce/model.safetensors", "ce/config.json", "ce/tokenizer.json"],
            "params": {"kind": "colbert"}}),
    )
    .err()
    .expect("an unknown reranker kind is refused");
    assert!(
        err.to_string().contains("unknown kind \"colbert\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundled_cross_encoder_reranks_at_rung_0_only() {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    let services = open_with_reranker(
        tmp.path(),
        json!({"id": "ce", "role": "reranker", "alias": "airlock-rerank",
            "files": ["ce/model.safetensors", "ce/config.json", "ce/tokenizer.json"],
            "params": {"max_tokens": 256, "batch_size": 8}}),
    )
    .expect("a bundle with a cross-encoder opens");
    assert_eq!(services.retrieval.reranker_name(), Some("ce"));
    let aliases: Vec<&str> = services.catalogue.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(
        aliases,
        ["airlock-embed", "airlock-small", "airlock-rerank"]
    );
    let t = TestApp::from_services(test_config(), services, tmp);

    let docs = [
        (
            "doc-a",
            "Liquidity buffer",
            "The liquidity buffer must stay above 15 percent of deposits.",
        ),
        (
            "doc-b",
            "Parental leave",
            "Parental leave lasts twenty weeks at full pay.",
        ),
        (
            "doc-c",
            "Deposit insurance",
            "Deposits are insured up to the statutory limit.",
        ),
    ];
    for (id, title, text) in docs {
        let r = t
            .call(
                Method::PUT,
                &format!("/v1/documents/{id}"),
                Some(&t.admin),
                Some(json!({"title": title, "text": text, "acl": {"users": [], "groups": ["staff"]}})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let reader = t.user("rita", &["staff"]);
    let query = "How large must the liquidity buffer be?";
    let retrieve = |rerank: bool| {
        let t = &t;
        let reader = reader.clone();
        async move {
            let r = t
                .call(
                    Method::POST,
                    "/v1/retrieve",
                    Some(&reader),
                    Some(json!({"query": query, "top_k": 3, "rerank": rerank})),
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            r.json
        }
    };

    // Rung 0: every result carries this model's score and the list is in its order.
    let r = retrieve(true).await;
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    let scores: Vec<f64> = results
        .iter()
        .map(|h| {
            h["stage_scores"]["rerank"]
                .as_f64()
                .expect("a rerank score")
        })
        .collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    // No per-stage timings for a non-admin (issue 19, F2); the scores above show the rerank ran.
    assert!(r.get("timings_ms").is_none(), "{r}");
    // The same model loaded directly scores the same passages (title + text) the same.
    let ce = CrossEncoder::load(
        &CrossEncoderFiles::in_dir(&staging.join("ce")),
        CrossEncoderConfig {
            name: "ce".into(),
            max_tokens: 256,
            batch_size: 8,
        },
    )
    .unwrap();
    for (h, s) in results.iter().zip(&scores) {
        let (_, title, text) = docs.iter().find(|d| d.0 == h["doc_id"]).unwrap();
        let direct = ce.score(query, &[&format!("{title}\n\n{text}")]).unwrap()[0];
        assert!((direct as f64 - s).abs() < 1e-4, "{direct} vs {s}");
    }

    // A request may skip it; so does rung 1 (the ladder's first step down).
    let r = retrieve(false).await;
    assert!(
        r["results"][0]["stage_scores"].get("rerank").is_none(),
        "{r}"
    );
    t.state.admission().set_rung(1);
    let r = retrieve(true).await;
    assert_eq!(r["rung"], 1, "{r}");
    assert!(
        r["results"][0]["stage_scores"].get("rerank").is_none(),
        "{r}"
    );
}
