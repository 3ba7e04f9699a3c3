//! Document files (issue 20 points 3, 4 and 6): raw-file `PUT /v1/documents/{id}`, the original
//! kept content-addressed and served by `GET /v1/documents/{id}/file` to readers only, removed
//! with the last live document naming it; refusals (415, 413, 422) change nothing; the
//! extraction limits come from the config.

use std::path::{Path, PathBuf};

use airlock::config::Config;
use airlock_acl::{AuditKind, AuditQuery};
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::json;

use crate::support::{Resp, TestApp, test_config};

const PDF: &str = "application/pdf";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../extract/tests/fixtures")
        .join(name)
}

async fn put_file(t: &TestApp, uri: &str, media_type: &str, bytes: Vec<u8>) -> Resp {
    let req = Request::put(uri)
        .header(header::AUTHORIZATION, format!("Bearer {}", t.admin))
        .header(header::CONTENT_TYPE, media_type)
        .body(Body::from(bytes))
        .unwrap();
    t.send(req).await
}

async fn get_file(t: &TestApp, id: &str, token: &str) -> Resp {
    t.call(
        Method::GET,
        &format!("/v1/documents/{id}/file"),
        Some(token),
        None,
    )
    .await
}

/// A reader's `GET /v1/documents/{id}/file`: status, headers and the body's raw bytes.
async fn file_bytes(
    t: &TestApp,
    id: &str,
    token: &str,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let req = Request::get(format!("/v1/documents/{id}/file"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    let resp = airlock::app(t.state.clone()).oneshot(req).await.unwrap();
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, bytes)
}

/// The digests in the originals directory, sorted.
fn originals(t: &TestApp) -> Vec<String> {
    let dir = t._dir.path().join("originals");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

async fn grant(t: &TestApp, id: &str, users: &[&str]) {
    // A grant naming the admin itself needs a second operator's approval (four eyes).
    let approval = t
        .approval(
            json!({"action": "document_grants", "doc_id": id, "users": users,
                         "groups": []}),
        )
        .await;
    let r = t
        .call_with(
            Method::PUT,
            &format!("/v1/acl/documents/{}", id.replace('/', "%2F")),
            Some(&t.admin),
            &[("x-airlock-approval", &approval)],
            Some(json!({"users": users, "groups": []})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn the_original_goes_to_readers_only_and_leaves_with_the_last_document() {
    let t = TestApp::new();
    let carol = t.user("carol", &[]);
    let dave = t.user("dave", &[]);
    let bytes = std::fs::read(fixture("table-two-pages.pdf")).unwrap();
    let sha = airlock_retrieval::sha256_hex(&bytes);

    let r = put_file(
        &t,
        "/v1/documents/rates%2Fsheet.pdf?title=Deposit%20rates",
        PDF,
        bytes.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert!(r.json["chunks"].as_u64().unwrap() > 0, "{}", r.json);
    let info = t
        .call(
            Method::GET,
            "/v1/documents/rates%2Fsheet.pdf",
            Some(&t.admin),
            None,
        )
        .await;
    assert_eq!(info.json["title"], "Deposit rates", "{}", info.text);
    assert_eq!(originals(&t), vec![sha.clone()]);
    // The same bytes under two ids share one stored file (a small CSV: cheap to embed).
    let csv = std::fs::read(fixture("branches.csv")).unwrap();
    let csv_sha = airlock_retrieval::sha256_hex(&csv);
    for id in ["b1", "b2"] {
        let r = put_file(&t, &format!("/v1/documents/{id}"), "text/csv", csv.clone()).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    }
    let mut both = vec![sha.clone(), csv_sha.clone()];
    both.sort();
    assert_eq!(originals(&t), both);
    grant(&t, "rates/sheet.pdf", &["carol"]).await;

    // A reader gets the bytes, typed, with a safe inline disposition; it is audited as shown.
    let (status, headers, body) = file_bytes(&t, "rates%2Fsheet.pdf", &carol).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers[header::CONTENT_TYPE], PDF);
    assert_eq!(
        headers[header::CONTENT_DISPOSITION],
        "inline; filename=\"sheet.pdf\"; filename*=UTF-8''sheet.pdf"
    );
    assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(
        headers[header::CONTENT_LENGTH],
        bytes.len().to_string().as_str()
    );
    assert!(body == bytes, "byte for byte");
    let acl = &t.state.services().unwrap().acl;
    let shown = acl
        .audit_query(&AuditQuery {
            user: Some("carol".into()),
            kind: Some(AuditKind::Shown),
            ..AuditQuery::default()
        })
        .unwrap();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].detail["doc_ids"], json!(["rates/sheet.pdf"]));

    // Not a reader, no such id, a document given as text: the same 404, byte for byte.
    let missing = get_file(&t, "no-such-doc", &carol).await;
    missing.assert_problem(404, "not-found", "no such document file");
    let denied = get_file(&t, "rates%2Fsheet.pdf", &dave).await;
    assert_eq!(denied.status, StatusCode::NOT_FOUND);
    assert_eq!(denied.text, missing.text);
    assert_eq!(
        denied.headers[header::CONTENT_TYPE],
        "application/problem+json"
    );
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/text-doc",
            Some(&t.admin),
            Some(json!({"title": "T", "text": "Plain text.", "acl": {"users": ["carol"], "groups": []}})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    assert_eq!(get_file(&t, "text-doc", &carol).await.text, missing.text);
    // A grant taken away is seen at once (re-checked per request).
    grant(&t, "rates/sheet.pdf", &[]).await;
    assert_eq!(
        get_file(&t, "rates%2Fsheet.pdf", &carol).await.text,
        missing.text
    );
    grant(&t, "rates/sheet.pdf", &["carol"]).await;
    let none_for_dave = acl
        .audit_query(&AuditQuery {
            user: Some("dave".into()),
            kind: Some(AuditKind::Shown),
            ..AuditQuery::default()
        })
        .unwrap();
    assert!(none_for_dave.is_empty(), "{none_for_dave:?}");

    // Deleting a document removes its file; a shared file stays while one document names it.
    let delete = |id: &'static str| {
        let t = &t;
        async move {
            let r = t
                .call(
                    Method::DELETE,
                    &format!("/v1/documents/{id}"),
                    Some(&t.admin),
                    None,
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        }
    };
    delete("rates%2Fsheet.pdf").await;
    assert_eq!(originals(&t), vec![csv_sha.clone()]);
    assert_eq!(
        get_file(&t, "rates%2Fsheet.pdf", &carol).await.text,
        missing.text
    );
    delete("b1").await;
    assert_eq!(originals(&t), vec![csv_sha.clone()]);
    // Replacing a document's file removes the old one; delete and purge leave no file behind.
    let md = b"# Branches\n\nAll branches open at nine.".to_vec();
    let r = put_file(&t, "/v1/documents/b2", "text/markdown", md.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(originals(&t), vec![airlock_retrieval::sha256_hex(&md)]);
    delete("b2").await;
    assert!(originals(&t).is_empty(), "{:?}", originals(&t));
    let r = t
        .call(Method::POST, "/v1/purge", Some(&t.admin), Some(json!({})))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(originals(&t).is_empty(), "{:?}", originals(&t));
    assert_eq!(
        get_file(&t, "rates%2Fsheet.pdf", &carol).await.text,
        missing.text
    );
}

#[tokio::test]
async fn refused_uploads_change_nothing_and_limits_come_from_the_config() {
    let t = TestApp::with_config(Config {
        body_limit: Some(20_000),
        upload_limit: Some(20_000),
        extract: Some(airlock_serving::extraction::ExtractConfig {
            limits: airlock_retrieval::ingest::ExtractLimits {
                max_pages: 1,
                ..Default::default()
            },
            ..Default::default()
        }),
        ..test_config()
    });
    let two_pages = std::fs::read(fixture("table-two-pages.pdf")).unwrap();
    // A type no extractor reads: 415 before the body is read.
    let r = put_file(&t, "/v1/documents/d", "application/zip", two_pages.clone()).await;
    r.assert_problem(
        415,
        "unsupported-media-type",
        "unsupported content type `application/zip`; send JSON or a file as application/pdf, \
         an Office Open XML type (.docx, .xlsx, .pptx), message/rfc822, text/csv, text/plain, \
         text/markdown or text/html",
    );
    // Over the upload limit: 413.
    let r = put_file(&t, "/v1/documents/d", PDF, vec![b'%'; 20_001]).await;
    r.assert_problem(
        413,
        "payload-too-large",
        "the request body exceeds the limit of 20000 bytes",
    );
    // Files the extractor refuses: 422 with the reason. The lowered page limit refuses a
    // two-page PDF that the default limits accept (previous test).
    for (name, media_type, reason) in [
        (
            "table-two-pages.pdf",
            PDF,
            "limit exceeded: max_pages (2 > 1)",
        ),
        ("scanned.pdf", PDF, "no text layer; OCR is not supported"),
        ("encrypted.pdf", PDF, "encrypted or password-protected"),
        (
            "hostile/billion-laughs.xlsx",
            "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
            "malformed xlsx",
        ),
    ] {
        let r = put_file(
            &t,
            "/v1/documents/d",
            media_type,
            std::fs::read(fixture(name)).unwrap(),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{name}: {}",
            r.text
        );
        assert_eq!(
            r.json["type"],
            "https://airlock.local/problems/not-extracted"
        );
        let detail = r.json["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("d: not extracted: ") && detail.contains(reason),
            "{name}: {detail}"
        );
    }
    // Not UTF-8 as text/plain: 422 too.
    let r = put_file(&t, "/v1/documents/d", "text/plain", vec![0xff, 0xfe, b'a']).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    // A JSON body with `?title=` is a mistake, not a silent drop.
    let r = t
        .call(
            Method::PUT,
            "/v1/documents/d?title=x",
            Some(&t.admin),
            Some(json!({"text": "x"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    // Nothing of any of it is stored: no row, no ordinal, no original.
    let s = t.state.services().unwrap();
    assert!(s.retrieval.document("d").unwrap().is_none());
    assert!(originals(&t).is_empty(), "{:?}", originals(&t));
    // A file that passes the lowered limits is stored, CSV as text/csv with a charset.
    let csv = std::fs::read(fixture("branches.csv")).unwrap();
    let r = put_file(
        &t,
        "/v1/documents/branches",
        "text/csv; charset=utf-8",
        csv.clone(),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text);
    grant(&t, "branches", &["admin"]).await;
    let r = get_file(&t, "branches", &t.admin).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.headers[header::CONTENT_TYPE], "text/csv; charset=utf-8");
    assert_eq!(
        r.headers[header::CONTENT_DISPOSITION],
        "attachment; filename=\"branches.csv\"; filename*=UTF-8''branches.csv"
    );
    assert_eq!(
        r.headers[header::CONTENT_SECURITY_POLICY],
        "sandbox; default-src 'none'"
    );
    assert_eq!(r.text.as_bytes(), &csv[..]);
}

/// `airlock ingest DIR` over a folder of the generated fixtures with hostile files among them:
/// every good file stored with its relative path as id and its sidecar grant, every hostile one
/// refused by name without stopping the run, in the JSON report; a re-run skips what is stored;
/// a bad sidecar line stops everything before a write; `[extract]` limits from `--config`.
#[test]
fn folder_ingest_with_sidecar_report_resume_and_refusals() {
    use crate::support::airlock_cli as airlock;
    let tmp = tempfile::tempdir().unwrap();
    let data = crate::eval::installed_appliance(tmp.path());
    let data_s = data.to_str().unwrap();
    let dir = tmp.path().join("share");
    let good = [
        ("policies/plain.pdf", "plain.pdf"),
        ("policies/policy.docx", "policy.docx"),
        ("rates.xlsx", "rates.xlsx"),
        ("board/committee.pptx", "committee.pptx"),
        ("mail/memo.eml", "memo.eml"),
        ("branches.csv", "branches.csv"),
    ];
    let hostile = [
        (
            "hostile/zip-bomb.docx",
            "hostile/zip-bomb.docx",
            "limit_exceeded",
        ),
        (
            "hostile/billion-laughs.xlsx",
            "hostile/billion-laughs.xlsx",
            "malformed",
        ),
        (
            "hostile/xobject-cycle.pdf",
            "hostile/xobject-cycle.pdf",
            "limit_exceeded",
        ),
        (
            "hostile/deep-nested.eml",
            "hostile/deep-nested.eml",
            "limit_exceeded",
        ),
        ("scans/scanned.pdf", "scanned.pdf", "no_text_layer"),
        ("scans/encrypted.pdf", "encrypted.pdf", "encrypted"),
    ];
    for (to, from) in good
        .iter()
        .copied()
        .chain(hostile.iter().map(|h| (h.0, h.1)))
    {
        let p = dir.join(to);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::copy(fixture(from), &p).unwrap();
    }
    std::fs::write(dir.join("old.msg"), b"\xd0\xcf\x11\xe0 not really").unwrap();
    std::fs::write(dir.join("notes.bin"), b"\x00\x01").unwrap();
    std::fs::write(
        dir.join(".acl.jsonl"),
        "{\"path\": \"**\", \"groups\": [\"staff\"]}\n\
         # the board's deck: the last matching rule wins\n\
         {\"path\": \"board/**\", \"users\": [\"ceo\"]}\n",
    )
    .unwrap();
    let report = tmp.path().join("report.json");
    let t = std::time::Instant::now();
    let out = airlock(&[
        "ingest",
        "--data",
        data_s,
        "--report",
        report.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    eprintln!("folder ingest: {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(
        out.status.code(),
        Some(1),
        "refusals make the exit status 1"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "6 documents stored, 8 refused"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ingest: files 14/14,"),
        "a plain progress line: {stderr}"
    );
    assert!(
        stderr.contains("refused: scans/scanned.pdf: no text layer; OCR is not supported"),
        "{stderr}"
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(
        (&r["files"], &r["stored"], &r["skipped"], &r["refused"]),
        (&json!(14), &json!(6), &json!(0), &json!(8)),
        "{r}"
    );
    let codes: std::collections::BTreeMap<String, String> = r["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["file"].as_str().unwrap().to_owned(),
                e["code"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (file, _, code) in hostile {
        assert_eq!(
            codes.get(file).map(String::as_str),
            Some(code),
            "{file}: {r}"
        );
    }
    assert_eq!(codes["old.msg"], "unsupported");
    assert_eq!(codes["notes.bin"], "unsupported_format");
    // Grants from the sidecar, in the documents' own transactions; originals on disk.
    let acl = airlock_acl::Acl::open(data.join("airlock.db")).unwrap();
    let g = acl
        .document_grants("board/committee.pptx")
        .unwrap()
        .unwrap();
    assert_eq!((g.users, g.groups), (vec!["ceo".to_string()], vec![]));
    let g = acl.document_grants("policies/plain.pdf").unwrap().unwrap();
    assert_eq!((g.users, g.groups), (vec![], vec!["staff".to_string()]));
    assert!(acl.document_grants("scans/scanned.pdf").unwrap().is_none());
    let originals = std::fs::read_dir(data.join("originals")).unwrap().count();
    assert_eq!(originals, 6);
    drop(acl);

    // The same run again: everything stored is skipped by digest, the refusals repeat.
    let out = airlock(&[
        "ingest",
        "--data",
        data_s,
        "--report",
        report.to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(
        (&r["stored"], &r["skipped"], &r["refused"]),
        (&json!(0), &json!(6), &json!(8)),
        "{r}"
    );

    // A bad sidecar line: named with its file and line, nothing written.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(fixture("table-two-pages.pdf"), bad.join("two.pdf")).unwrap();
    std::fs::write(
        bad.join(".acl.jsonl"),
        "{\"path\": \"*.pdf\", \"groups\": [\"staff\"]}\n{\"path\": \"../x\"}\n",
    )
    .unwrap();
    let out = airlock(&["ingest", "--data", data_s, bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".acl.jsonl line 2"), "{stderr}");
    let acl = airlock_acl::Acl::open(data.join("airlock.db")).unwrap();
    assert!(
        acl.ordinal("two.pdf").unwrap().is_none(),
        "nothing was written"
    );
    drop(acl);

    // `[extract]` limits from the config: a lowered page limit refuses a PDF that passes.
    std::fs::remove_file(bad.join(".acl.jsonl")).unwrap();
    let config = tmp.path().join("airlock.toml");
    std::fs::write(&config, "[extract]\nmax_pages = 1\n").unwrap();
    let out = airlock(&[
        "ingest",
        "--data",
        data_s,
        "--config",
        config.to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refused: two.pdf: limit exceeded: max_pages (2 > 1)"),
        "{stderr}"
    );
    let out = airlock(&["ingest", "--data", data_s, bad.to_str().unwrap()]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "1 documents stored, 0 refused"
    );
}

/// Issue 42 M4: whoever writes into one folder of a share controls that folder only. A JSONL
/// file under `public/` that names `hr/salaries.txt` adds `public/x.jsonl/hr/salaries.txt`
/// with the JSONL file's grant and leaves the HR file alone; a file whose sidecar rule depends
/// on case (`HR/` against `hr/**`) is refused unless `sidecar_glob_case` says how the share
/// compares names; a sidecar below the top of the folder stops the run before any write.
#[test]
fn folder_ingest_keeps_each_folder_to_its_own_grant() {
    use crate::support::airlock_cli as airlock;
    let tmp = tempfile::tempdir().unwrap();
    let (bundle, keyring) = crate::ingest_crash::embedder_bundle(tmp.path());
    let data = crate::ingest_crash::appliance(tmp.path(), &bundle, &keyring);
    let data_s = data.to_str().unwrap();
    let share = tmp.path().join("share");
    for (path, text) in [
        (
            ".acl.jsonl",
            "{\"path\": \"**\", \"groups\": [\"staff\"]}\n\
             {\"path\": \"hr/**\", \"groups\": [\"hr\"]}\n\
             {\"path\": \"public/**\", \"groups\": [\"everyone\"]}\n",
        ),
        (
            "hr/salaries.txt",
            "Salaries: the chief executive earns 900k.",
        ),
        (
            "public/x.jsonl",
            "{\"doc_id\": \"hr/salaries.txt\", \"text\": \"Salaries are public: all zero.\"}\n\
             {\"doc_id\": \"../hr/other.txt\", \"text\": \"Escaping the file.\"}\n",
        ),
        (
            "HR/pay.txt",
            "Pay bands for the HR folder as the share spells it.",
        ),
    ] {
        let p = share.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
    }
    let report = tmp.path().join("report.json");
    let out = airlock(&[
        "ingest",
        "--data",
        data_s,
        "--report",
        report.to_str().unwrap(),
        share.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "refusals make the exit status 1"
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let errors: Vec<(&str, &str)> = r["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["file"].as_str().unwrap(), e["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        errors,
        [
            ("HR/pay.txt", "acl_case_dependent"),
            ("public/x.jsonl", "invalid_id")
        ],
        "{r}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refused: HR/pay.txt: its sidecar rule depends on case (line 1 matching exactly, line 2 ignoring case)"),
        "{stderr}"
    );
    let grants = |id: &str| {
        let acl = airlock_acl::Acl::open(data.join("airlock.db")).unwrap();
        acl.document_grants(id).unwrap().map(|g| g.groups)
    };
    assert_eq!(grants("hr/salaries.txt"), Some(vec!["hr".to_string()]));
    assert_eq!(
        grants("public/x.jsonl/hr/salaries.txt"),
        Some(vec!["everyone".to_string()])
    );
    assert_eq!(grants("HR/pay.txt"), None, "refused: nothing stored");
    let text_of = |id: &str| -> String {
        let db = rusqlite::Connection::open(data.join("airlock.db")).unwrap();
        db.query_row(
            "SELECT group_concat(c.text, ' ') FROM chunks c JOIN documents d
              ON d.ordinal = c.doc_ordinal AND c.version = d.version WHERE d.doc_id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert!(text_of("hr/salaries.txt").contains("900k"));
    assert!(text_of("public/x.jsonl/hr/salaries.txt").contains("all zero"));

    // The operator says the share is case-insensitive: `HR/` is the `hr/` folder.
    let config = tmp.path().join("airlock.toml");
    std::fs::write(&config, "sidecar_glob_case = \"insensitive\"\n").unwrap();
    std::fs::remove_file(share.join("public/x.jsonl")).unwrap();
    let out = airlock(&[
        "ingest",
        "--data",
        data_s,
        "--config",
        config.to_str().unwrap(),
        share.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    assert_eq!(grants("HR/pay.txt"), Some(vec!["hr".to_string()]));

    // A sidecar below the top: the whole run stops before anything is written.
    std::fs::write(share.join("public/new.txt"), "A new public notice.").unwrap();
    std::fs::write(
        share.join("public/.acl.jsonl"),
        "{\"path\": \"**\", \"groups\": [\"everyone\"]}\n",
    )
    .unwrap();
    let out = airlock(&["ingest", "--data", data_s, share.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("public/.acl.jsonl: a permissions sidecar is applied only as"),
        "{stderr}"
    );
    assert_eq!(grants("public/new.txt"), None, "nothing was written");
}
