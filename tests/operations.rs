//! Operating the binary: the Docker image's exact command, graceful shutdown on signals, and
//! configuration errors at start.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

/// The JSON array of a Dockerfile instruction (`CMD ["serve", …]`).
fn dockerfile_array(instruction: &str) -> Vec<String> {
    let dockerfile = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Dockerfile")).unwrap();
    let line = dockerfile.lines().find(|l| l.starts_with(instruction)).unwrap_or_else(|| panic!("no {instruction} in Dockerfile"));
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
    let server = common::start_binary(&args, &[("ZTSERVE_LISTEN", "127.0.0.1:0"), ("ZTSERVE_SOURCES", "models")]);
    assert_eq!(common::http_get(&server.address, "/healthz").0, 200);
    let (status, body) = common::http_get(&server.address, "/models");
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(list["models"].as_array().unwrap().len(), 2);
}

fn signal_stops_the_server(signal: &str) {
    let mut server = common::start_binary(&["serve", "--listen", "127.0.0.1:0", "--source", "models"], &[]);
    assert_eq!(common::http_get(&server.address, "/readyz").0, 200);
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
        (vec![("ZTSERVE_MAX_RANGES", "zero")], "ZTSERVE_MAX_RANGES"),
        (vec![("ZTSERVE_LISTEN", "not-an-address")], "listen"),
        (vec![("ZTSERVE_LOG_FORMAT", "xml")], "log_format"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_ztserve")).arg("serve").envs(envs).output().unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
    let output = Command::new(env!("CARGO_BIN_EXE_ztserve")).args(["serve", "--config", "/nonexistent.toml"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent.toml"));
}

#[test]
fn each_request_logs_one_json_line_with_route_model_object_status_bytes_and_duration() {
    let server = common::start_binary(&["serve", "--listen", "127.0.0.1:0", "--source", "models", "--log-format", "json"], &[]);
    assert_eq!(common::http_get(&server.address, "/models/demo%2Fdense/objects/mask").0, 200);
    let started = Instant::now();
    let line = loop {
        let found = server.log.lock().unwrap().iter().find(|l| l.contains("\"path\":\"/models/demo%2Fdense/objects/mask\"")).cloned();
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
    let (_, body) = common::http_get(address, "/models");
    let list: serde_json::Value = serde_json::from_slice(&body).unwrap();
    list["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_rescan_timer_picks_up_new_and_removed_files_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let demo = concat!(env!("CARGO_MANIFEST_DIR"), "/models/demo/dense.zt");
    std::fs::copy(demo, dir.path().join("first.zt")).unwrap();
    let source = dir.path().display().to_string();
    let server = common::start_binary(&["serve", "--listen", "127.0.0.1:0", "--source", &source], &[("ZTSERVE_RESCAN_INTERVAL_SECS", "1")]);
    assert_eq!(model_ids(&server.address), ["first"]);
    std::fs::copy(demo, dir.path().join("second.zt.tmp")).unwrap();
    std::fs::rename(dir.path().join("second.zt.tmp"), dir.path().join("second.zt")).unwrap();
    std::fs::remove_file(dir.path().join("first.zt")).unwrap();
    let started = Instant::now();
    while model_ids(&server.address) != ["second"] {
        assert!(started.elapsed() < Duration::from_secs(10), "rescan did not pick up the change: {:?}", model_ids(&server.address));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn requests_beyond_the_concurrency_limit_wait_for_a_slot_instead_of_failing() {
    let server = common::start_binary(&["serve", "--listen", "127.0.0.1:0", "--source", "models"], &[("ZTSERVE_MAX_CONCURRENT_REQUESTS", "1")]);
    let address = server.address.clone();
    let threads: Vec<_> = (0..16)
        .map(|_| {
            let address = address.clone();
            std::thread::spawn(move || common::http_get(&address, "/models/demo%2Fdense/objects/counts"))
        })
        .collect();
    for thread in threads {
        let (status, body) = thread.join().unwrap();
        assert_eq!((status, body.len()), (200, 4096 * 8));
    }
}
