//! The real clients over TLS, each verifying ztserve against a CA made here (never told to skip
//! verification): curl, the aws CLI (`AWS_CA_BUNDLE`), rclone (`--ca-cert`), skopeo and
//! podman (the CA in a `certs.d` directory of their own), boto3, s3fs, huggingface_hub
//! (`snapshot_download`, `hf download`), the Python client, oras-py and KServe's `oci://` and
//! `hf://` initializer (tests/interop/tls_clients.py). Each reads the same bytes; each refuses the
//! server when it trusts another CA; with client certificates required, curl and the Python
//! client get no data without one.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::tls::{TestCa, client_config, get_once};
use common::{InProcess, model, run_interop_script};
use rustls::version::TLS13;
use ztserve::config::{Config, SourceSpec};
use ztserve::format::DType;

const TENSOR: [u8; 16] = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

/// Runs `program ARGS` with `envs`, off the test's runtime.
async fn run(program: &str, args: Vec<String>, envs: Vec<(String, String)>) -> Output {
    common::external(program);
    let program = program.to_owned();
    tokio::task::spawn_blocking(move || {
        Command::new(&program)
            .args(&args)
            .env_remove("AWS_CA_BUNDLE")
            .envs(envs)
            .output()
            .unwrap_or_else(|e| panic!("{program} does not run ({e}): scripts/test installs it"))
    })
    .await
    .unwrap()
}

fn succeeded(what: &str, output: &Output) -> Vec<u8> {
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output.stdout.clone()
}

fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|s| s.to_string()).collect()
}

/// A `certs.d`-style directory holding `ca` as `ca.crt`, as podman and skopeo read one.
fn cert_dir(ca: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(ca, dir.join("ca.crt")).unwrap();
    dir.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_verify_the_server_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    std::fs::write(models.join("shared.zt"), model(&[("w", DType::U8, &TENSOR, false)])).unwrap();
    let ca = TestCa::new(&dir.path().join("pki"), "ztserve test CA");
    let other = TestCa::new(&dir.path().join("other"), "another CA");
    let (cert, key) = ca.server("server", &rcgen::PKCS_ECDSA_P256_SHA256);
    let mut config = Config::serving(vec![SourceSpec::local(&models)]);
    config.tls.cert_file = Some(cert.clone());
    config.tls.key_file = Some(key.clone());
    let server = InProcess::start(config.clone(), true).await;
    config.tls.client_ca_file = Some(ca.ca_file());
    let mtls = InProcess::start(config, false).await;
    let port = |address: &str| address.rsplit(':').next().unwrap().to_owned();
    let (http, s3, mtls_url) = (
        format!("https://localhost:{}", port(&server.address)),
        format!("https://localhost:{}", port(server.s3_address.as_ref().unwrap())),
        format!("https://localhost:{}", port(&mtls.address)),
    );
    let trusting = client_config(&ca.ca_file(), None, &[&TLS13]);
    let expected = get_once(&server.address, &trusting, "/models/shared/model.safetensors", &[]).await.unwrap();
    assert_eq!(expected.status, 200);
    let expected_file = dir.path().join("expected.safetensors");
    std::fs::write(&expected_file, &expected.body).unwrap();
    let ca_file = ca.ca_file().display().to_string();

    // curl: verified, refused under another CA (60: the peer's certificate cannot be verified),
    // and without a client certificate where one is required.
    let url = format!("{http}/models/shared/model.safetensors");
    let got = run("curl", words(&["-sS", "--fail", "--cacert", &ca_file, &url]), vec![]).await;
    assert_eq!(succeeded("curl", &got), expected.body);
    let other_ca = other.ca_file().display().to_string();
    let refused = run("curl", words(&["-sS", "--cacert", &other_ca, &url]), vec![]).await;
    assert_eq!(refused.status.code(), Some(60), "{}", String::from_utf8_lossy(&refused.stderr));
    let mtls_object = format!("{mtls_url}/models/shared/objects/w");
    let anonymous = run("curl", words(&["-sS", "--fail", "--cacert", &ca_file, &mtls_object]), vec![]).await;
    assert!(!anonymous.status.success() && anonymous.stdout.is_empty(), "no data without a certificate");
    let (client_cert, client_key) = ca.client("worker", "worker-a", None);
    let with_cert = run(
        "curl",
        words(&[
            "-sS",
            "--fail",
            "--cacert",
            &ca_file,
            "--cert",
            client_cert.to_str().unwrap(),
            "--key",
            client_key.to_str().unwrap(),
            &mtls_object,
        ]),
        vec![],
    )
    .await;
    assert_eq!(succeeded("curl with a client certificate", &with_cert), TENSOR);

    // The aws CLI with AWS_CA_BUNDLE, and rclone with --ca-cert: the object, byte for byte.
    let aws_envs = vec![
        ("AWS_DEFAULT_REGION".to_owned(), "us-east-1".to_owned()),
        ("AWS_CONFIG_FILE".into(), "/dev/null".into()),
        ("AWS_SHARED_CREDENTIALS_FILE".into(), "/dev/null".into()),
        ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ("AWS_CA_BUNDLE".into(), ca_file.clone()),
    ];
    let aws_copy = dir.path().join("aws.safetensors");
    let aws = run(
        "/usr/bin/aws",
        words(&[
            "s3",
            "cp",
            "--no-sign-request",
            "--endpoint-url",
            &s3,
            "s3://models/shared/model.safetensors",
            aws_copy.to_str().unwrap(),
        ]),
        aws_envs.clone(),
    )
    .await;
    succeeded("aws s3 cp", &aws);
    assert_eq!(std::fs::read(&aws_copy).unwrap(), expected.body);
    let rclone_config = dir.path().join("rclone.conf");
    std::fs::write(&rclone_config, "").unwrap();
    let rclone_envs = vec![
        ("RCLONE_CONFIG".to_owned(), rclone_config.display().to_string()),
        ("RCLONE_CONFIG_ZT_TYPE".into(), "s3".into()),
        ("RCLONE_CONFIG_ZT_PROVIDER".into(), "Other".into()),
        ("RCLONE_CONFIG_ZT_ENDPOINT".into(), s3.clone()),
    ];
    let rclone = run(
        "rclone",
        words(&["cat", "--ca-cert", &ca_file, "zt:models/shared/model.safetensors"]),
        rclone_envs.clone(),
    )
    .await;
    assert_eq!(succeeded("rclone cat", &rclone), expected.body);
    let rclone =
        run("rclone", words(&["cat", "--ca-cert", &other_ca, "zt:models/shared/model.safetensors"]), rclone_envs).await;
    assert!(!rclone.status.success(), "rclone trusted another CA");

    // skopeo and podman, with the CA in a certs.d directory of their own.
    let registry = format!("localhost:{}", port(&server.address));
    let certs = cert_dir(&ca.ca_file(), &dir.path().join("certs.d"));
    let strangers = cert_dir(&other.ca_file(), &dir.path().join("other-certs.d"));
    let reference = format!("docker://{registry}/shared:latest");
    let certs_arg = certs.display().to_string();
    let inspected = run("skopeo", words(&["inspect", "--raw", "--cert-dir", &certs_arg, &reference]), vec![]).await;
    let manifest: serde_json::Value = serde_json::from_slice(&succeeded("skopeo inspect", &inspected)).unwrap();
    assert!(manifest["layers"].as_array().is_some_and(|l| !l.is_empty()), "{manifest}");
    let layout = format!("oci:{}:shared", dir.path().join("layout").display());
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"default": [{"type": "insecureAcceptAnything"}]}"#).unwrap();
    let policy_arg = policy.display().to_string();
    let copied = run(
        "skopeo",
        words(&["copy", "--policy", &policy_arg, "--src-cert-dir", &certs_arg, &reference, &layout]),
        vec![],
    )
    .await;
    succeeded("skopeo copy", &copied);
    let strange = strangers.display().to_string();
    let refused = run("skopeo", words(&["inspect", "--raw", "--cert-dir", &strange, &reference]), vec![]).await;
    assert!(!refused.status.success(), "skopeo trusted another CA");
    let root = dir.path().join("podman");
    let podman = |args: Vec<String>| {
        let mut all = words(&[
            "--root",
            root.join("storage").to_str().unwrap(),
            "--runroot",
            root.join("run").to_str().unwrap(),
            "--storage-driver",
            "vfs",
            "--events-backend",
            "none",
        ]);
        all.extend(args);
        run("podman", all, vec![])
    };
    let image = format!("{registry}/shared:latest-image");
    succeeded("podman pull", &podman(words(&["pull", "--quiet", "--cert-dir", &certs_arg, &image])).await);
    let mounted = succeeded("podman image mount", &podman(words(&["image", "mount", &image])).await);
    let models_dir = Path::new(String::from_utf8(mounted).unwrap().trim()).join("models");
    assert!(std::fs::read_dir(&models_dir).unwrap().next().is_some(), "the image holds the model's files");
    succeeded("podman image unmount", &podman(words(&["image", "unmount", &image])).await);
    let _ = podman(words(&["rmi", "--all", "--force"])).await;

    // The Python clients, each with the trust settings its users set.
    let plan = serde_json::json!({
        "url": http,
        "s3_url": s3,
        "hf_url": format!("{http}/hf"),
        "registry": registry,
        "mtls_url": mtls_url,
        "ca_file": ca_file,
        "other_ca_file": other_ca,
        "client_cert": client_cert,
        "client_key": client_key,
        "model": "shared",
        "repo": "local/shared",
        "expected": expected_file,
        "tensor": TENSOR,
    });
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
    for venv in ["client", "oras"] {
        let plan_path = plan_path.clone();
        let out = tokio::task::spawn_blocking(move || {
            run_interop_script(venv, "tls_clients.py", &[Path::new(venv), &plan_path])
        })
        .await
        .unwrap();
        assert!(out.contains("checked"), "{venv}: {out}");
    }
    mtls.stop().await.unwrap();
    server.stop().await.unwrap();
}
