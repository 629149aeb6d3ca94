//! Access control over real sockets: bearer tokens on `/models…`, open probes, `/metrics`
//! open or protected by config, per-token model prefixes that answer 404 outside them
//! exactly as for a model that does not exist, a token file re-read when it changes, and
//! tokens that never reach the log.

use crate::common;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Reply, model, request, serve, start_binary};
use ztserve::config::{Config, SourceSpec};
use ztserve::format::DType;

const ADMIN: &str = "admin-0123456789abcdef";
const TEAM_A: &str = "team-a-0123456789abcdef";

/// A source with `team-a/llama`, `team-ab/x` and `shared`, each one 16-byte object `w`.
fn models(dir: &Path) {
    for id in ["team-a/llama", "team-ab/x", "shared"] {
        let path = dir.join(format!("{id}.zt"));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, model(&[("w", DType::U8, &[7; 16], false)])).unwrap();
    }
}

fn get(address: &str, path: &str, token: Option<&str>) -> Reply {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer.iter().map(|b| ("Authorization", b.as_str())).collect();
    request(address, path, &headers)
}

fn ids(reply: &Reply) -> Vec<String> {
    reply.json()["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_need_a_valid_token_and_probes_and_metrics_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    models(dir.path());
    let config = Config {
        sources: ztserve::config::Sources { paths: vec![SourceSpec::local(dir.path())], ..Default::default() },
        auth: ztserve::config::Auth { tokens: common::tokens(vec![ADMIN.into()]), ..Default::default() },
        ..Config::default()
    };
    let (address, _state) = serve(config).await;
    tokio::task::spawn_blocking(move || {
        for path in [
            "/models",
            "/models/shared",
            "/models/shared/objects/w",
            "/models/shared/objects/w/components/data",
            "/models/shared/file",
            "/models/nope",
            "/nowhere",
        ] {
            let missing = get(&address, path, None);
            assert_eq!(missing.status, 401, "{path}");
            assert_eq!(missing.header("www-authenticate"), Some(r#"Bearer realm="ztserve""#), "{path}");
            assert_eq!(missing.json()["error"]["code"], "unauthorized");
            for wrong in ["admin-0123456789abcdeX", "admin-0123456789abcde", "", "a"] {
                let refused = get(&address, path, Some(wrong));
                assert_eq!(refused.status, 401, "{path} with {wrong:?}");
            }
            let invalid = get(&address, path, Some("admin-0123456789abcdeX"));
            assert_eq!(invalid.header("www-authenticate"), Some(r#"Bearer realm="ztserve", error="invalid_token""#));
        }
        // Another scheme, or the token without one, is no bearer token.
        assert_eq!(request(&address, "/models", &[("Authorization", ADMIN)]).status, 401);
        assert_eq!(request(&address, "/models", &[("Authorization", &format!("Basic {ADMIN}"))]).status, 401);
        // The scheme is case-insensitive (RFC 9110 11.1).
        assert_eq!(request(&address, "/models", &[("Authorization", &format!("bearer {ADMIN}"))]).status, 200);
        let listed = get(&address, "/models", Some(ADMIN));
        assert_eq!(ids(&listed), ["shared", "team-a/llama", "team-ab/x"]);
        assert_eq!(get(&address, "/models/shared/objects/w", Some(ADMIN)).body, [7; 16]);
        for open in ["/healthz", "/readyz", "/metrics"] {
            assert_eq!(get(&address, open, None).status, 200, "{open}");
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_a_token() {
    let dir = tempfile::tempdir().unwrap();
    models(dir.path());
    let config = Config {
        sources: ztserve::config::Sources { paths: vec![SourceSpec::local(dir.path())], ..Default::default() },
        auth: ztserve::config::Auth {
            tokens: common::tokens(vec![ADMIN.into()]),
            metrics_require_token: true,
            ..Default::default()
        },
        ..Config::default()
    };
    let (address, _state) = serve(config).await;
    tokio::task::spawn_blocking(move || {
        assert_eq!(get(&address, "/metrics", None).status, 401);
        let scraped = get(&address, "/metrics", Some(ADMIN));
        assert_eq!(scraped.status, 200);
        assert!(String::from_utf8_lossy(&scraped.body).contains("ztserve_auth_failures_total{reason=\"missing\"}"));
        assert_eq!(get(&address, "/healthz", None).status, 200);
        assert_eq!(get(&address, "/readyz", None).status, 200);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limited_to_a_prefix_sees_nothing_outside_it() {
    let dir = tempfile::tempdir().unwrap();
    models(dir.path());
    let config = Config {
        sources: ztserve::config::Sources { paths: vec![SourceSpec::local(dir.path())], ..Default::default() },
        auth: ztserve::config::Auth {
            tokens: common::tokens(vec![ADMIN.into(), format!("{TEAM_A} team-a/")]),
            ..Default::default()
        },
        ..Config::default()
    };
    let (address, _state) = serve(config).await;
    tokio::task::spawn_blocking(move || {
        assert_eq!(ids(&get(&address, "/models", Some(TEAM_A))), ["team-a/llama"]);
        let inside = "/models/team-a%2Fllama";
        for suffix in ["", "/objects/w", "/objects/w/components/data", "/file"] {
            assert_eq!(get(&address, &format!("{inside}{suffix}"), Some(TEAM_A)).status, 200, "{suffix}");
        }
        for (hidden, unknown) in [("team-ab%2Fx", "team-ab%2Fy"), ("shared", "unshared")] {
            for suffix in ["", "/objects/w", "/objects/w/components/data", "/file"] {
                let outside = get(&address, &format!("/models/{hidden}{suffix}"), Some(TEAM_A));
                let missing = get(&address, &format!("/models/{unknown}{suffix}"), Some(TEAM_A));
                assert_eq!(outside.status, 404, "{hidden}{suffix}");
                // The same answer as for a model that does not exist, but for its name.
                let hidden_id = hidden.replace("%2F", "/");
                let unknown_id = unknown.replace("%2F", "/");
                assert_eq!(
                    String::from_utf8_lossy(&outside.body),
                    String::from_utf8_lossy(&missing.body).replace(&unknown_id, &hidden_id)
                );
                assert_eq!(get(&address, &format!("/models/{hidden}{suffix}"), Some(ADMIN)).status, 200);
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_file_is_re_read_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    models(dir.path());
    let tokens = tempfile::tempdir().unwrap();
    let file = tokens.path().join("tokens");
    fs::write(&file, format!("# operators\n{ADMIN}\n")).unwrap();
    let config = Config {
        sources: ztserve::config::Sources { paths: vec![SourceSpec::local(dir.path())], ..Default::default() },
        auth: ztserve::config::Auth { token_file: Some(file.display().to_string().into()), ..Default::default() },
        ..Config::default()
    };
    let (address, _state) = serve(config).await;
    let eventually = |address: &str, token: &str, status: u16| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while get(address, "/models", Some(token)).status != status {
            assert!(Instant::now() < deadline, "{token} did not answer {status} within 10 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    tokio::task::spawn_blocking(move || {
        assert_eq!(get(&address, "/models", Some(ADMIN)).status, 200);
        assert_eq!(get(&address, "/models", Some(TEAM_A)).status, 401);
        // Replaced by rename, as secret managers do.
        let next = tokens.path().join("tokens.new");
        fs::write(&next, format!("{TEAM_A} team-a\n")).unwrap();
        fs::rename(&next, &file).unwrap();
        eventually(&address, TEAM_A, 200);
        assert_eq!(get(&address, "/models", Some(ADMIN)).status, 401, "a removed token still works");
        assert_eq!(ids(&get(&address, "/models", Some(TEAM_A))), ["team-a/llama"]);
        // A broken edit revokes the file's tokens rather than keeping stale ones.
        fs::write(&file, format!("{TEAM_A} team-a\nnot a token\n")).unwrap();
        eventually(&address, TEAM_A, 401);
        fs::remove_file(&file).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(get(&address, "/models", Some(TEAM_A)).status, 401);
        assert_eq!(get(&address, "/models", None).status, 401, "a missing token file must not open the server");
        fs::write(&file, format!("{ADMIN}\n")).unwrap();
        eventually(&address, ADMIN, 200);
    })
    .await
    .unwrap();
}

#[test]
fn tokens_from_the_environment_work_and_never_reach_the_log() {
    let server = start_binary(
        &["serve", "--listen", "127.0.0.1:0", "--source", "models", "--log-format", "json"],
        &[("ZTSERVE_AUTH__TOKENS", &format!("{ADMIN}, {TEAM_A} demo")), ("RUST_LOG", "debug")],
    );
    assert_eq!(get(&server.address, "/models", None).status, 401);
    assert_eq!(get(&server.address, "/models/demo%2Fdense", Some(ADMIN)).status, 200);
    assert_eq!(get(&server.address, "/models/demo%2Fdense", Some(TEAM_A)).status, 200);
    assert_eq!(get(&server.address, "/models/demo%2Fdense", Some("wrong-0123456789abcdef")).status, 401);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.log.lock().unwrap().iter().filter(|l| l.contains("\"status\":401")).count() < 2 {
        assert!(Instant::now() < deadline, "refusals are not logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server.log.lock().unwrap().join("\n");
    for secret in [ADMIN, TEAM_A, "wrong-0123456789abcdef"] {
        assert!(!log.contains(secret), "the log shows a token");
    }

    // A token too short stops the start, naming the key and where it came from but not repeating it.
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
        .args(["serve", "--listen", "127.0.0.1:0", "--source", "models"])
        .env("ZTSERVE_AUTH__TOKENS", format!("{ADMIN},tooshort"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let named = "auth.tokens (from environment variable ZTSERVE_AUTH__TOKENS)";
    assert!(stderr.contains(named) && stderr.contains("at least 16"), "{stderr}");
    assert!(!stderr.contains("tooshort") && !stderr.contains(ADMIN), "{stderr}");
}

/// A wrong S3 key is the client's error: answered 403 and logged as that request's line, never
/// as an ERROR, even when `RUST_LOG` asks for everything at INFO.
#[test]
fn a_wrong_s3_key_is_no_error_in_the_log() {
    let server = start_binary(
        &["serve", "--listen", "127.0.0.1:0", "--source", "models"],
        &[("ZTSERVE_AUTH__TOKENS", ADMIN), ("ZTSERVE_S3_ENDPOINT__LISTEN", "127.0.0.1:0"), ("RUST_LOG", "info")],
    );
    let s3_address = |log: &[String]| {
        log.iter()
            .find_map(|l| l.contains("S3 endpoint listening").then(|| l.split("address=").nth(1)).flatten())
            .map(|rest| rest.split_whitespace().next().unwrap().to_owned())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let address = loop {
        if let Some(address) = s3_address(&server.log.lock().unwrap()) {
            break address;
        }
        assert!(Instant::now() < deadline, "the S3 endpoint did not log its address");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Dated now: s3s refuses a date far from its clock before it looks at the key.
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string().replace(['-', ':'], "");
    let signed = format!(
        "AWS4-HMAC-SHA256 Credential=AKIAWRONGWRONGWRONG1/{}/us-east-1/s3/aws4_request, \
         SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={}",
        &now[..8],
        "0".repeat(64)
    );
    let headers = [
        ("Authorization", signed.as_str()),
        ("x-amz-date", now.as_str()),
        ("x-amz-content-sha256", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ];
    assert_eq!(request(&address, "/models/demo/dense/model.safetensors", &headers).status, 403);
    while !server.log.lock().unwrap().iter().any(|l| l.contains("status=403")) {
        assert!(Instant::now() < deadline, "the refusal is not logged");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server.log.lock().unwrap().join("\n");
    assert!(!log.contains("ERROR"), "a client's wrong key logged an error:\n{log}");
}
