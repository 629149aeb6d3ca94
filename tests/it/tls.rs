//! TLS on every listener, against a CA made here: each key type (RSA, ECDSA, Ed25519) over TLS
//! 1.2 and 1.3 on the HTTP contract, the Hub API, the registry and the S3 endpoint; a client
//! trusting another CA refused with a certificate error; certificates reloaded when their files
//! change while an open connection keeps answering, and a broken rotation keeping the old one;
//! client certificates required at the handshake and granted models by identity; bad files
//! refused at start naming the file; plaintext and stalled handshakes closed and counted; a
//! property test of garbage before and during a handshake; and another ztserve reading this
//! one's `/hf` and S3 endpoint over TLS, verified against a configured CA.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::tls::{KEY_TYPES, TestCa, client_config, connect, get, get_once, send, server_certificate};
use common::{InProcess, metric, model};
use rustls::version::{TLS12, TLS13};
use sha2::Digest as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use ztserve::config::{Config, IdentityEntry, SourceSpec};
use ztserve::format::DType;

/// A source with `team-a/llama` and `shared`, each one 16-byte object `w`.
fn models(dir: &Path) {
    for id in ["team-a/llama", "shared"] {
        let path = dir.join(format!("{id}.zt"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, model(&[("w", DType::U8, &[7; 16], false)])).unwrap();
    }
}

fn config_with_tls(models: &Path, cert: &Path, key: &Path) -> Config {
    let mut config = Config::serving(vec![SourceSpec::local(models)]);
    config.tls.cert_file = Some(cert.to_owned());
    config.tls.key_file = Some(key.to_owned());
    config
}

/// Waits until the series reaches `at_least`: the server counts a closed connection just after
/// closing it, so the client can see the close first.
/// The demo models over TLS in `dir`, client certificates of a test CA required: the
/// configuration, and the CA that issues them.
fn config_with_client_certificates(dir: &Path) -> (Config, TestCa) {
    models(&dir.join("models"));
    let ca = TestCa::new(&dir.join("pki"), "ztserve test CA");
    let (cert, key) = ca.server("server", &rcgen::PKCS_ECDSA_P256_SHA256);
    let mut config = config_with_tls(&dir.join("models"), &cert, &key);
    config.tls.client_ca_file = Some(ca.ca_file());
    (config, ca)
}

async fn counted(name: &str, labels: &[(&str, &str)], at_least: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(name, labels) < at_least {
        assert!(Instant::now() < deadline, "{name}{labels:?} stayed at {}", metric(name, labels));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Publishes `cert` and `key` as `tls.crt` and `tls.key` of `secret`, as the kubelet updates a
/// mounted Secret: both in a new directory, then the `..data` link swapped to it by a rename,
/// so a reader sees the old pair or the new one, never half of each.
fn publish_secret(secret: &Path, generation: u32, cert: &[u8], key: &[u8]) -> (PathBuf, PathBuf) {
    let version = secret.join(format!("..{generation}"));
    std::fs::create_dir_all(&version).unwrap();
    std::fs::write(version.join("tls.crt"), cert).unwrap();
    std::fs::write(version.join("tls.key"), key).unwrap();
    let staged = secret.join("..data_tmp");
    std::os::unix::fs::symlink(format!("..{generation}"), &staged).unwrap();
    std::fs::rename(&staged, secret.join("..data")).unwrap();
    for name in ["tls.crt", "tls.key"] {
        let link = secret.join(name);
        if link.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
    (secret.join("tls.crt"), secret.join("tls.key"))
}

fn ids(body: &[u8]) -> Vec<String> {
    let listed: serde_json::Value = serde_json::from_slice(body).unwrap();
    listed["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listener_speaks_tls_with_each_key_type_and_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    models(&dir.path().join("models"));
    let ca = TestCa::new(&dir.path().join("pki"), "ztserve test CA");
    for (kind, alg) in KEY_TYPES {
        let (cert, key) = ca.server(kind, alg);
        let running = InProcess::start(config_with_tls(&dir.path().join("models"), &cert, &key), true).await;
        let s3 = running.s3_address.clone().unwrap();
        for (version, name) in [(&TLS13, "1.3"), (&TLS12, "1.2")] {
            let client = client_config(&ca.ca_file(), None, &[version]);
            let mut connection = connect(&running.address, &client).await.unwrap();
            let negotiated = connection.get_ref().1.protocol_version().unwrap();
            assert_eq!(format!("{negotiated:?}"), format!("TLSv{}", name.replace('.', "_")), "{kind}");
            for path in ["/models", "/models/shared/objects/w", "/hf/api/models", "/v2/"] {
                let reply = get(&mut connection, path, &[]).await.unwrap();
                assert_eq!(reply.status, 200, "{kind} TLS {name} {path}");
            }
            let object = get(&mut connection, "/models/shared/objects/w", &[]).await.unwrap();
            assert_eq!(object.body, vec![7; 16]);
            let listed = get_once(&s3, &client, "/models?list-type=2", &[]).await.unwrap();
            assert_eq!(listed.status, 200, "{kind} TLS {name}: the S3 endpoint's ListObjectsV2");
            assert!(String::from_utf8_lossy(&listed.body).contains("<Key>shared/model.safetensors</Key>"));
        }
        let strangers = TestCa::new(&dir.path().join("other"), "another CA");
        let error = connect(&running.address, &client_config(&strangers.ca_file(), None, &[&TLS13])).await.unwrap_err();
        assert!(error.to_string().contains("invalid peer certificate"), "{kind}: {error}");
        running.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_to_new_handshakes_while_open_connections_go_on() {
    let dir = tempfile::tempdir().unwrap();
    models(&dir.path().join("models"));
    let ca = TestCa::new(&dir.path().join("pki"), "ztserve test CA");
    let (first_cert, first_key) = ca.server("first", &rcgen::PKCS_ECDSA_P256_SHA256);
    let secret = dir.path().join("secret");
    let read = |path: &Path| std::fs::read(path).unwrap();
    let (cert, key) = publish_secret(&secret, 1, &read(&first_cert), &read(&first_key));
    let running = InProcess::start(config_with_tls(&dir.path().join("models"), &cert, &key), false).await;
    let client = client_config(&ca.ca_file(), None, &[&TLS13]);
    let mut open = connect(&running.address, &client).await.unwrap();
    let first = server_certificate(&open);
    assert_eq!(get(&mut open, "/models", &[]).await.unwrap().status, 200);

    // cert-manager renews the Secret; the kubelet swaps the mounted files.
    let (next_cert, next_key) = ca.server("second", &rcgen::PKCS_ED25519);
    publish_secret(&secret, 2, &read(&next_cert), &read(&next_key));
    let deadline = Instant::now() + Duration::from_secs(60);
    let second = loop {
        let presented = server_certificate(&connect(&running.address, &client).await.unwrap());
        if presented != first {
            break presented;
        }
        assert!(Instant::now() < deadline, "the rotated certificate was never served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    counted("ztserve_tls_reloads_total", &[("outcome", "ok")], 1.0).await;
    assert_eq!(metric("ztserve_tls_reloads_total", &[("outcome", "error")]), 0.0, "the swap is read whole");
    assert_eq!(get(&mut open, "/models", &[]).await.unwrap().status, 200, "the open connection goes on");

    // A rotation that breaks the key keeps the certificate in force and says so.
    let broken = b"-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n";
    publish_secret(&secret, 3, &read(&next_cert), broken);
    counted("ztserve_tls_reloads_total", &[("outcome", "error")], 1.0).await;
    let mut fresh = connect(&running.address, &client).await.unwrap();
    assert_eq!(server_certificate(&fresh), second, "the last good certificate stays");
    assert_eq!(get(&mut fresh, "/models", &[]).await.unwrap().status, 200);
    assert_eq!(get(&mut open, "/models", &[]).await.unwrap().status, 200);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_and_grant_models_by_identity() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, ca) = config_with_client_certificates(dir.path());
    config.auth.client_identities = vec![
        IdentityEntry::parse("cn:worker-a team-a").unwrap(),
        IdentityEntry::parse("uri:spiffe://fleet/ns/gpu/sa/loader").unwrap(),
    ];
    let running = InProcess::start(config, true).await;
    let s3 = running.s3_address.clone().unwrap();

    // Without a certificate, or with one from another CA, no handshake completes.
    let anonymous = client_config(&ca.ca_file(), None, &[&TLS13]);
    let refused = get_once(&running.address, &anonymous, "/models", &[]).await;
    assert!(refused.is_err(), "a client without a certificate gets no data");
    let strangers = TestCa::new(&dir.path().join("other"), "another CA");
    let forged = strangers.client("forged", "worker-a", None);
    let forged = client_config(&ca.ca_file(), Some(&forged), &[&TLS13]);
    assert!(get_once(&running.address, &forged, "/models", &[]).await.is_err());
    counted("ztserve_tls_handshakes_total", &[("outcome", "client_certificate")], 2.0).await;

    // A listed CN reads its prefixes; a listed SPIFFE ID (a URI SAN) reads everything.
    let worker_a = client_config(&ca.ca_file(), Some(&ca.client("worker-a", "worker-a", None)), &[&TLS13]);
    let listed = get_once(&running.address, &worker_a, "/models", &[]).await.unwrap();
    assert_eq!(ids(&listed.body), ["team-a/llama"]);
    assert_eq!(get_once(&running.address, &worker_a, "/models/shared", &[]).await.unwrap().status, 404);
    let spiffe = ca.client("loader", "loader", Some("spiffe://fleet/ns/gpu/sa/loader"));
    let loader = client_config(&ca.ca_file(), Some(&spiffe), &[&TLS12]);
    let everything = get_once(&running.address, &loader, "/models", &[]).await.unwrap();
    assert_eq!(ids(&everything.body), ["shared", "team-a/llama"]);
    let listed = get_once(&s3, &loader, "/models?list-type=2", &[]).await.unwrap();
    assert_eq!(listed.status, 200, "the S3 endpoint grants it too");
    let unlisted_s3 = get_once(&s3, &worker_a, "/models/shared/model.safetensors", &[]).await.unwrap();
    assert_eq!(unlisted_s3.status, 404, "outside its prefixes, as a missing key");
    assert!(metric("ztserve_auth_client_identity_requests_total", &[("identity", "cn:worker-a")]) >= 2.0);

    // A valid certificate whose identity is not listed reads nothing without a token.
    let unlisted = client_config(&ca.ca_file(), Some(&ca.client("worker-z", "worker-z", None)), &[&TLS13]);
    assert_eq!(get_once(&running.address, &unlisted, "/models", &[]).await.unwrap().status, 401);
    assert_eq!(get_once(&running.address, &unlisted, "/hf/api/models/local/shared", &[]).await.unwrap().status, 401);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn client_certificates_granted_writing_publish_artifacts_and_others_may_not() {
    let dir = tempfile::tempdir().unwrap();
    let (mut config, ca) = config_with_client_certificates(dir.path());
    config.auth.client_identities = vec![IdentityEntry::parse("cn:reader").unwrap()];
    config.artifacts.dir = Some(dir.path().join("artifacts"));
    config.artifacts.writer_identities = vec![
        IdentityEntry::parse("uri:spiffe://fleet/ns/gpu/sa/compiler vllm").unwrap(),
        IdentityEntry::parse("dns:builder.fleet vllm").unwrap(),
    ];
    config.artifacts.allow_unsigned = true;
    let running = InProcess::start(config, true).await;
    let blob = b"compiled kernels";
    let hex = hex::encode(sha2::Sha256::digest(blob));
    let (blob_path, bundle_path) = (format!("/artifacts/blobs/sha256:{hex}"), "/artifacts/bundles/vllm/abc");
    let bundle = format!(r#"{{"files": [{{"path": "k.so", "sha256": "{hex}", "size": {}}}]}}"#, blob.len());
    let json = [("Content-Type", "application/json")];

    // A reader's certificate reads, and may not write.
    let reader = client_config(&ca.ca_file(), Some(&ca.client("reader", "reader", None)), &[&TLS13]);
    let mut connection = connect(&running.address, &reader).await.unwrap();
    assert_eq!(send(&mut connection, "PUT", &blob_path, &[], blob).await.unwrap().status, 403);
    // Names equal to a writer's, of another kind, are not that writer: a common name equal to
    // the SPIFFE ID, an e-mail address and a URI equal to the DNS name.
    let impostors = [
        ca.client("cn-impostor", "spiffe://fleet/ns/gpu/sa/compiler", None),
        ca.client_with(
            "email-impostor",
            "impostor",
            vec![rcgen::SanType::Rfc822Name("builder.fleet".try_into().unwrap())],
        ),
        ca.client_with("uri-impostor", "builder.fleet", vec![rcgen::SanType::URI("builder.fleet".try_into().unwrap())]),
    ];
    for impostor in impostors {
        let impostor = client_config(&ca.ca_file(), Some(&impostor), &[&TLS13]);
        let mut connection = connect(&running.address, &impostor).await.unwrap();
        assert_eq!(send(&mut connection, "PUT", &blob_path, &[], blob).await.unwrap().status, 403);
    }
    let builder =
        ca.client_with("builder", "builder", vec![rcgen::SanType::DnsName("builder.fleet".try_into().unwrap())]);
    let builder = client_config(&ca.ca_file(), Some(&builder), &[&TLS13]);
    let mut connection = connect(&running.address, &builder).await.unwrap();
    let built = b"built kernels";
    let built_path = format!("/artifacts/blobs/sha256:{}", hex::encode(sha2::Sha256::digest(built)));
    assert_eq!(send(&mut connection, "PUT", &built_path, &[], built).await.unwrap().status, 201);
    // The compiler's identity (a SPIFFE ID) writes below vllm/ and nowhere else.
    let spiffe = ca.client("compiler", "compiler", Some("spiffe://fleet/ns/gpu/sa/compiler"));
    let compiler = client_config(&ca.ca_file(), Some(&spiffe), &[&TLS13]);
    let mut connection = connect(&running.address, &compiler).await.unwrap();
    assert_eq!(send(&mut connection, "PUT", &blob_path, &[], blob).await.unwrap().status, 201);
    let outside = send(&mut connection, "PUT", "/artifacts/bundles/triton/abc", &json, bundle.as_bytes()).await;
    assert_eq!(outside.unwrap().status, 403);
    // A refused body is not read, so the server closes that connection.
    let mut connection = connect(&running.address, &compiler).await.unwrap();
    assert_eq!(send(&mut connection, "PUT", bundle_path, &json, bundle.as_bytes()).await.unwrap().status, 201);
    let read = get_once(&running.address, &reader, bundle_path, &[]).await.unwrap();
    assert_eq!(read.status, 200);
    running.stop().await.unwrap();
}

#[tokio::test]
async fn bad_certificate_files_stop_the_start_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(&dir.path().join("pki"), "ztserve test CA");
    let (cert, key) = ca.server("server", &rcgen::PKCS_ECDSA_P256_SHA256);
    let (_, other_key) = ca.server("other", &rcgen::PKCS_ECDSA_P256_SHA256);
    let (expired, expired_key) = ca.expired_server("expired");
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let missing = dir.path().join("missing.pem");
    let start = |cert: &Path, key: &Path| {
        let config = config_with_tls(dir.path(), cert, key);
        ztserve::server::Server::new(config).err().map(|e| format!("{e:#}")).unwrap_or_default()
    };
    for (cert, key, named, says) in [
        (&missing, &key, &missing, "cannot read certificate file"),
        (&cert, &missing, &missing, "cannot read key file"),
        (&empty, &key, &empty, "holds no PEM certificate"),
        (&cert, &empty, &empty, "holds no PEM private key"),
        (&cert, &other_key, &other_key, "does not match the certificate"),
        (&expired, &expired_key, &expired, "expired"),
    ] {
        let error = start(cert, key);
        assert!(error.contains(&named.display().to_string()) && error.contains(says), "{says}: {error}");
    }
    let mut config = config_with_tls(dir.path(), &cert, &key);
    config.tls.client_ca_file = Some(empty.clone());
    let error = format!("{:#}", ztserve::server::Server::new(config).err().unwrap());
    assert!(error.contains("client CA file") && error.contains(&empty.display().to_string()), "{error}");
    // A source's CA file as well: the source is refused, naming the file.
    let mut config = Config::serving(vec![SourceSpec::try_from("hf://local/shared".to_owned()).unwrap()]);
    config.hub_source.ca_file = Some(empty.clone());
    let error = format!("{:#}", ztserve::server::Server::new(config).err().unwrap());
    assert!(error.contains("holds no PEM certificate") && error.contains(&empty.display().to_string()), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_and_stalled_handshakes_are_closed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    models(&dir.path().join("models"));
    let ca = TestCa::new(&dir.path().join("pki"), "ztserve test CA");
    let (cert, key) = ca.server("server", &rcgen::PKCS_ECDSA_P256_SHA256);
    let mut config = config_with_tls(&dir.path().join("models"), &cert, &key);
    config.tls.handshake_timeout_secs = 1;
    let running = InProcess::start(config, false).await;

    let mut plain = tokio::net::TcpStream::connect(&running.address).await.unwrap();
    plain.write_all(b"GET /models HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer).await;
    assert!(!String::from_utf8_lossy(&answer).contains("models"), "no data over plaintext");
    counted("ztserve_tls_handshakes_total", &[("outcome", "not_tls")], 1.0).await;

    // A client that connects and sends nothing is closed once the handshake time is up.
    let mut stalled = tokio::net::TcpStream::connect(&running.address).await.unwrap();
    let mut nothing = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(60), stalled.read_to_end(&mut nothing)).await;
    assert!(closed.is_ok() && nothing.is_empty(), "the stalled handshake is closed");
    counted("ztserve_tls_handshakes_total", &[("outcome", "timeout")], 1.0).await;

    // Garbage before and during a handshake never stops the listener.
    for garbage in [&b"\x16\x03\x01\xff\xff"[..], &[0u8; 4096][..], b"\x16\x03\x03\x00\x05hello"] {
        let mut stream = tokio::net::TcpStream::connect(&running.address).await.unwrap();
        let _ = stream.write_all(garbage).await;
        let _ = stream.shutdown().await;
        let _ = stream.read_to_end(&mut Vec::new()).await;
    }
    let client = client_config(&ca.ca_file(), None, &[&TLS13]);
    assert_eq!(get_once(&running.address, &client, "/models", &[]).await.unwrap().status, 200);
    running.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ztserve_reads_another_over_tls_verified_against_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    models(&dir.path().join("models"));
    let ca = TestCa::new(&dir.path().join("pki"), "ztserve test CA");
    let (cert, key) = ca.server("origin", &rcgen::PKCS_ECDSA_P256_SHA256);
    let origin = InProcess::start(config_with_tls(&dir.path().join("models"), &cert, &key), true).await;
    let port = origin.address.rsplit(':').next().unwrap();
    let s3_port = origin.s3_address.as_ref().unwrap().rsplit(':').next().unwrap();
    let mirror_config = |ca_file: Option<&Path>| {
        let mut config = Config::serving(vec![SourceSpec::try_from("hf://local/shared".to_owned()).unwrap()]);
        config.hub_source.endpoint = Some(format!("https://localhost:{port}/hf"));
        config.hub_source.ca_file = ca_file.map(Path::to_owned);
        config.hub_source.retries = 0;
        config.sources.on_unreadable = ztserve::config::OnUnreadableSource::Degrade;
        config
    };
    let mirror = InProcess::start(mirror_config(Some(&ca.ca_file())), false).await;
    let listed = common::request_async(&mirror.address, "/models", &[]).await;
    let id = ids(&listed.body).pop().expect("the mirror lists the origin's model");
    let reply = common::request_async(&mirror.address, &format!("/models/{id}/objects/w"), &[]).await;
    assert_eq!((reply.status, reply.body), (200, vec![7; 16]), "read through TLS");
    mirror.stop().await.unwrap();

    // Without the CA, the origin is not trusted: the source is unreadable, and says why.
    let untrusting = InProcess::start(mirror_config(None), false).await;
    let ready = common::request_async(&untrusting.address, "/readyz", &[]).await.json();
    let reason = ready["sources"][0]["reason"].as_str().expect("the source is failing").to_owned();
    assert!(reason.to_lowercase().contains("certificate"), "{reason}");
    untrusting.stop().await.unwrap();

    // An S3 source over TLS: the origin's S3 endpoint, its stored files' bucket.
    let mut config = Config::serving(vec![SourceSpec::try_from("s3://models-stored".to_owned()).unwrap()]);
    config.s3_source.endpoint = Some(format!("https://localhost:{s3_port}"));
    config.s3_source.region = Some("us-east-1".into());
    config.s3_source.access_key_id = Some("unused".into());
    config.s3_source.secret_access_key = Some("unused".into());
    config.s3_source.ca_file = Some(ca.ca_file());
    let from_s3 = InProcess::start(config, false).await;
    let ready = common::request_async(&from_s3.address, "/readyz", &[]).await.json();
    assert_eq!(ready["sources"][0]["status"], "ok", "{ready}");
    let listed = common::request_async(&from_s3.address, "/models", &[]).await;
    // The stored files' bucket holds each model's files below its id: `shared/shared.zt`.
    assert_eq!(ids(&listed.body), ["shared/shared", "team-a/llama/llama"]);
    let reply = common::request_async(&from_s3.address, "/models/shared%2Fshared/objects/w", &[]).await;
    assert_eq!((reply.status, reply.body), (200, vec![7; 16]), "read from S3 over TLS");
    from_s3.stop().await.unwrap();
    origin.stop().await.unwrap();
}

/// A property: whatever arrives before a handshake, or cuts into a real one (a client's first
/// flight up to any byte, then any bytes), ends that connection alone; the listener answers the
/// next client, and the server never stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_before_or_during_a_handshake_ends_that_connection_alone() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config as Cases, RngAlgorithm, TestRng, TestRunner};
    use std::io::{Read as _, Write as _};

    let dir = tempfile::tempdir().unwrap();
    models(&dir.path().join("models"));
    let ca = TestCa::new(&dir.path().join("pki"), "ztserve test CA");
    let (cert, key) = ca.server("server", &rcgen::PKCS_ECDSA_P256_SHA256);
    let running = InProcess::start(config_with_tls(&dir.path().join("models"), &cert, &key), false).await;
    let client = client_config(&ca.ca_file(), None, &[&TLS13, &TLS12]);
    let mut opening = rustls::ClientConnection::new(client.clone(), "localhost".try_into().unwrap()).unwrap();
    let mut hello = Vec::new();
    opening.write_tls(&mut hello).unwrap();

    let (address, runtime) = (running.address.clone(), tokio::runtime::Handle::current());
    tokio::task::spawn_blocking(move || {
        let cases = Cases { cases: 256, failure_persistence: None, ..Cases::default() };
        let mut runner = TestRunner::new_with_rng(cases, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
        let strategy = (0..=hello.len(), proptest::collection::vec(any::<u8>(), 0..4096));
        runner
            .run(&strategy, |(cut, garbage)| {
                let mut stream = std::net::TcpStream::connect(&address).unwrap();
                let _ = stream.write_all(&hello[..cut]);
                let _ = stream.write_all(&garbage);
                // The client has said all it will: the server must close, not wait for more.
                let _ = stream.shutdown(std::net::Shutdown::Write);
                let mut answer = Vec::new();
                let _ = stream.read_to_end(&mut answer);
                let served = runtime.block_on(get_once(&address, &client, "/models", &[]));
                prop_assert_eq!(served.map(|reply| reply.status).ok(), Some(200));
                Ok(())
            })
            .unwrap();
    })
    .await
    .unwrap();
    running.stop().await.unwrap();
}
