//! Operating the binary: the Docker image's exact command, graceful shutdown on signals, and
//! configuration errors at start.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

/// The JSON array of a Dockerfile instruction (`CMD ["serve", …]`).
fn dockerfile_array(instruction: &str) -> Vec<String> {
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap();
    let line = dockerfile
        .lines()
        .find(|l| l.starts_with(instruction))
        .unwrap_or_else(|| panic!("no {instruction} in Dockerfile"));
    serde_json::from_str(line[instruction.len()..].trim()).unwrap()
}

#[test]
fn the_dockerfile_command_serves_the_demo_models_and_answers_healthz() {
    assert_eq!(dockerfile_array("ENTRYPOINT"), ["ztserve"]);
    let cmd = dockerfile_array("CMD");
    // Inside the image the config lives in /etc/ztserve and the models in /models; here the
    // same files come from the repository. The listen address is the only change (port 0).
    let args: Vec<String> = cmd.iter().map(|a| a.replace("/etc/ztserve/ztserve.toml", "config/ztserve.toml")).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server =
        common::start_binary(&args, &[("ZTSERVE_SERVER__LISTEN", "127.0.0.1:0"), ("ZTSERVE_SOURCES__PATHS", "models")]);
    assert_eq!(common::request(&server.address, "/healthz", &[]).status, 200);
    let common::Reply { status, body, .. } = common::request(&server.address, "/models", &[]);
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let ids: Vec<&str> = list["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    let expected = [
        "demo/dense",
        "demo/structured",
        "gguf/tiny/tiny-F16",
        "gguf/tiny/tiny-Q8_0",
        "hf/tiny-llama",
        "v2/seekable",
        "v2/sharded",
    ];
    assert_eq!(ids, expected, "the data shards and the checkpoint's shards are not models");
    assert!(list["models"].as_array().unwrap().iter().all(|m| m["status"] == "ok"), "{list}");
}

fn signal_stops_the_server(signal: &str) {
    let mut server = common::start_binary(&["serve", "--listen", "127.0.0.1:0", "--source", "models"], &[]);
    assert_eq!(common::request(&server.address, "/readyz", &[]).status, 200);
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "still running 20 s after {signal}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit after {signal}: {status:?}");
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    signal_stops_the_server("-TERM");
}

#[test]
fn sigint_stops_the_server_cleanly() {
    signal_stops_the_server("-INT");
}

#[test]
fn invalid_configuration_fails_at_start_naming_the_key() {
    for (envs, expected) in [
        (vec![("ZTSERVE_LIMITS__MAX_RANGES", "zero")], "ZTSERVE_LIMITS__MAX_RANGES"),
        (vec![("ZTSERVE_SERVER__LISTEN", "not-an-address")], "server.listen"),
        (vec![("ZTSERVE_SERVER__LOG_FORMAT", "xml")], "server.log_format"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_ztserve")).arg("serve").envs(envs).output().unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
    let output =
        Command::new(env!("CARGO_BIN_EXE_ztserve")).args(["serve", "--config", "/nonexistent.toml"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent.toml"));
}

/// A deployment written for an earlier release (flat keys in its file, `ZTSERVE_LISTEN`,
/// `ZTSERVE_SOURCES`, "off" written as `""` or `0`) starts as before, each old name logged
/// once as deprecated with its new one.
#[test]
fn a_deployment_with_the_flat_names_of_earlier_releases_starts_and_is_told_the_new_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("old.toml");
    std::fs::write(&file, "max_ranges = 5\ns3_listen = \"\"\nrequest_timeout_secs = 0\ntoken_file = \"\"\n").unwrap();
    let server = common::start_binary(
        &["serve", "--config", file.to_str().unwrap()],
        &[("ZTSERVE_LISTEN", "127.0.0.1:0"), ("ZTSERVE_SOURCES", "models"), ("ZTSERVE_LOG_FORMAT", "text")],
    );
    assert_eq!(common::request(&server.address, "/models", &[]).status, 200);
    let log = server.log.lock().unwrap().join("\n");
    for (old, new) in [
        ("ZTSERVE_LISTEN", "ZTSERVE_SERVER__LISTEN"),
        ("ZTSERVE_SOURCES", "ZTSERVE_SOURCES__PATHS"),
        ("ZTSERVE_LOG_FORMAT", "ZTSERVE_SERVER__LOG_FORMAT"),
        ("config key \"max_ranges\"", "max_ranges in [limits]"),
        ("config key \"request_timeout_secs\"", "request_timeout_secs in [limits]"),
    ] {
        let told = format!("is deprecated: use {new}");
        let lines = log.lines().filter(|l| l.contains(old) && l.contains(&told)).count();
        assert_eq!(lines, 1, "{old} {told}, once, in:\n{log}");
    }
}

/// What a client asks that is not there, or that a protocol does not serve, is answered as
/// that protocol's "not found" and logged as a request, never as an error: huggingface_hub asks
/// `/api/agent-harnesses` in every process, and an operator's 5xx alert must not fire for it.
/// Each line names the path the client sent, prefix included.
#[test]
fn what_is_not_there_is_no_error_in_the_log_and_each_line_names_the_path_sent() {
    let server = common::start_binary(
        &["serve", "--listen", "127.0.0.1:0", "--source", "models", "--log-format", "json"],
        &[("ZTSERVE_S3_ENDPOINT__LISTEN", "127.0.0.1:0")],
    );
    let a = server.address.as_str();
    let harnesses = common::request(a, "/hf/api/agent-harnesses", &[]);
    assert_eq!(harnesses.status, 200);
    assert_eq!(harnesses.json(), serde_json::json!({ "standardEnvVars": [], "harnesses": {} }));
    let asked = [
        ("/hf/api/whoami-v2", 404),
        ("/hf/api/models?author=nobody", 200),
        ("/models/nothing", 404),
        ("/models/demo/dense/", 200),
        ("/v2/nothing/manifests/latest", 404),
    ];
    for (path, status) in asked {
        assert_eq!(common::request(a, path, &[]).status, status, "{path}");
    }
    let s3 = {
        let log = server.log.lock().unwrap();
        let line = log.iter().find(|l| l.contains("S3 endpoint listening")).expect("the S3 endpoint's address");
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        event["fields"]["address"].as_str().unwrap().to_owned()
    };
    assert_eq!(common::request(&s3, "/models/nothing/config.json", &[]).status, 404);
    let sent: Vec<&str> = ["/hf/api/agent-harnesses"]
        .into_iter()
        .chain(asked.iter().map(|(p, _)| p.split('?').next().unwrap()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    let logged = |path: &str| {
        let needle = format!("\"path\":\"{path}\"");
        server.log.lock().unwrap().iter().any(|l| l.contains(&needle) && l.contains("\"status\":"))
    };
    while !sent.iter().chain(["/models/nothing/config.json"].iter()).all(|p| logged(p)) {
        assert!(
            Instant::now() < deadline,
            "not every request was logged with its path:\n{}",
            server.log.lock().unwrap().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = server.log.lock().unwrap().join("\n");
    assert!(!log.contains("\"level\":\"ERROR\""), "an ERROR line for what is not there:\n{log}");
    assert!(!log.contains("\"level\":\"WARN\""), "a WARN line for what is not there:\n{log}");
}

#[test]
fn each_request_logs_one_json_line_with_route_model_object_status_bytes_and_duration() {
    let server =
        common::start_binary(&["serve", "--listen", "127.0.0.1:0", "--source", "models", "--log-format", "json"], &[]);
    assert_eq!(common::request(&server.address, "/models/demo%2Fdense/objects/mask", &[]).status, 200);
    let started = Instant::now();
    let line = loop {
        let found = server
            .log
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("\"path\":\"/models/demo%2Fdense/objects/mask\""))
            .cloned();
        if let Some(line) = found {
            break line;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no request line logged");
        std::thread::sleep(Duration::from_millis(20));
    };
    let event: serde_json::Value = serde_json::from_str(&line).unwrap();
    let span = &event["span"];
    assert_eq!(span["method"], "GET");
    assert_eq!(span["route"], "/models/{model}/objects/{object}");
    assert_eq!(span["model"], "demo/dense");
    assert_eq!(span["object"], "mask");
    assert_eq!(span["status"], 200);
    assert_eq!(span["bytes"], 16);
    assert!(span["duration_ms"].as_f64().unwrap() >= 0.0);
}

fn model_ids(address: &str) -> Vec<String> {
    let body = common::request(address, "/models", &[]).body;
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    list["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_rescan_timer_picks_up_new_and_removed_files_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/models/demo/dense.zt");
    std::fs::copy(demo, dir.path().join("first.zt")).unwrap();
    let source = dir.path().display().to_string();
    let server = common::start_binary(
        &["serve", "--listen", "127.0.0.1:0", "--source", &source],
        &[("ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS", "1")],
    );
    assert_eq!(model_ids(&server.address), ["first"]);
    std::fs::copy(demo, dir.path().join("second.zt.tmp")).unwrap();
    std::fs::rename(dir.path().join("second.zt.tmp"), dir.path().join("second.zt")).unwrap();
    std::fs::remove_file(dir.path().join("first.zt")).unwrap();
    let started = Instant::now();
    while model_ids(&server.address) != ["second"] {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "rescan did not pick up the change: {:?}",
            model_ids(&server.address)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn requests_beyond_the_concurrency_limit_wait_for_a_slot_instead_of_failing() {
    let server = common::start_binary(
        &["serve", "--listen", "127.0.0.1:0", "--source", "models"],
        &[("ZTSERVE_LIMITS__MAX_CONCURRENT_REQUESTS", "1")],
    );
    let address = server.address.clone();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let address = address.clone();
            std::thread::spawn(move || common::request(&address, "/models/demo%2Fdense/objects/counts", &[]))
        })
        .collect();
    for thread in threads {
        let reply = thread.join().unwrap();
        assert_eq!((reply.status, reply.body.len()), (200, 4096 * 8));
    }
}

/// docker-compose.yml, parsed.
fn compose() -> serde_json::Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yml")).unwrap();
    serde_norway::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_compose_file_serves_the_demo_models_from_the_bucket_its_upload_job_fills() {
    let compose = compose();
    let services = &compose["services"];
    // The upload job mirrors ./models into the bucket: do the same against moto.
    let upload = services["upload"]["command"][0].as_str().unwrap();
    assert!(upload.contains("mc mb --ignore-existing store/models"), "{upload}");
    assert!(upload.contains("mc mirror --overwrite /models store/models\n"), "{upload}");
    assert_eq!(services["upload"]["volumes"][0], "./models:/models:ro");
    let s3 = common::start_s3();
    s3.create_bucket("models");
    let client = s3.client("models");
    let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    // Every file below ./models, at any depth, as `mc mirror` copies it.
    let mut pending = vec![models.clone()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let key = path.strip_prefix(&models).unwrap().to_str().unwrap().to_owned();
            use object_store::ObjectStoreExt as _;
            let key = object_store::path::Path::from(key);
            client.put(&key, object_store::PutPayload::from(std::fs::read(&path).unwrap())).await.unwrap();
        }
    }
    // ztserve with the compose environment; only the endpoint, credentials and port differ.
    assert_eq!(services["ztserve"]["depends_on"]["upload"]["condition"], "service_completed_successfully");
    let environment = services["ztserve"]["environment"].as_object().unwrap();
    assert_eq!(environment["ZTSERVE_SOURCES__PATHS"], "s3://models");
    let mut envs: Vec<(String, String)> = environment
        .iter()
        .map(|(k, v)| {
            let value = match k.as_str() {
                "ZTSERVE_S3_SOURCE__ENDPOINT" => s3.endpoint.clone(),
                "ZTSERVE_SERVER__LISTEN" => "127.0.0.1:0".to_owned(),
                "AWS_ACCESS_KEY_ID" | "AWS_SECRET_ACCESS_KEY" => "testing".to_owned(),
                _ => v.as_str().unwrap().to_owned(),
            };
            (k.clone(), value)
        })
        .collect();
    envs.push(("ZTSERVE_SERVER__LOG_FORMAT".into(), "text".into()));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let cmd = dockerfile_array("CMD");
    let args: Vec<String> = cmd.iter().map(|a| a.replace("/etc/ztserve/ztserve.toml", "config/ztserve.toml")).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Blocking, but the server is another process: nothing here waits on this runtime.
    let server = common::start_binary(&args, &envs);
    let address = server.address.clone();
    let common::Reply { status, body, .. } =
        tokio::task::spawn_blocking(move || common::request(&address, "/models", &[])).await.unwrap();
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let served: Vec<(&str, &str, &str)> = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["source"].as_str().unwrap(), m["status"].as_str().unwrap()))
        .collect();
    let ok = |id| (id, "s3://models", "ok");
    assert_eq!(
        served,
        [
            ok("demo/dense"),
            ok("demo/structured"),
            ok("gguf/tiny/tiny-F16"),
            ok("gguf/tiny/tiny-Q8_0"),
            ok("hf/tiny-llama"),
            ok("v2/seekable"),
            ok("v2/sharded")
        ]
    );
    let address = server.address.clone();
    let common::Reply { status, body, .. } =
        tokio::task::spawn_blocking(move || common::request(&address, "/models/demo%2Fdense/file", &[])).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body, std::fs::read(models.join("demo/dense.zt")).unwrap());
}

/// A server in the test's process runs as the binary does (`ztserve::server::serve`), and its
/// shutdown future drains it the same way: an answer under way is sent whole, then `serve`
/// returns and nothing more is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_drains_when_its_shutdown_future_completes() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let source = common::ModelSource::local();
    let weights: Vec<u8> = (0..8u32 << 20).flat_map(|i| i.to_le_bytes()).collect();
    source.put("big.zt", &common::model(&[("w", ztserve::format::DType::U32, &weights, false)])).await;
    let running = common::InProcess::start(source.config(ztserve::config::Config::default()), false).await;
    let address = running.address.clone();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream.write_all(b"GET /models/big/objects/w HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut first = vec![0; 4096];
    let got = stream.read(&mut first).await.unwrap();
    assert!(first[..got].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first[..got]));
    // The answer is under way (32 MiB, of which the client has read a page): stop now.
    let stopped = tokio::spawn(running.stop());
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await.unwrap();
    let whole = [&first[..got], &rest[..]].concat();
    let body_at = whole.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert!(whole[body_at..] == weights[..], "the answer under way was sent whole");
    stopped.await.unwrap().expect("serve returns Ok once drained");
    assert!(tokio::net::TcpStream::connect(&address).await.is_err(), "nothing is accepted after the drain");
}
