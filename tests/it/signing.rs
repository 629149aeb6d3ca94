//! Signed models, signed by the real tool: PyPI `model-signing` 1.1.1 signs models with a key
//! and with a certificate (offline), a sharded safetensors checkpoint, a `.zt` model and a GGUF
//! directory among them; then copies are tampered with (one byte of a shard, a file added, one
//! removed, one renamed, signed by an untrusted key, the trusted key's hint over another key's
//! signature, a truncated, an oversized and a mistyped bundle). Under `required` and
//! `if-signed` each tampered model is refused with its own reason on every protocol while the
//! others serve, under `none` all serve as today, and `ztserve verify DIR` reaches the same
//! verdict with the same code. Copies taken back out through the Hub API and the S3 endpoint
//! verify with `model_signing verify`: a Hub repository (a checkpoint; a directory of GGUF
//! models) and a model's prefix of the stored bucket.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{InProcess, request_async, run_interop_script, venv_root};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use serde_json::Value;
use ztserve::config::{Config, SigningPolicy, SourceSpec};

const MAX_SIGNATURE_BYTES: u64 = 1 << 20;

/// Each model, and what its signature is found to say: its state, and its reason when failed.
const EXPECTED: &[(&str, &str, Option<&str>)] = &[
    ("key-sharded", "verified", None),
    ("cert-zt/dense", "verified", None),
    ("gguf/tiny-F16", "verified", None),
    ("gguf/tiny-Q8_0", "verified", None),
    ("byte", "failed", Some("signature_digest_mismatch")),
    ("added", "failed", Some("signature_unsigned_file")),
    ("removed", "failed", Some("signature_missing_file")),
    ("renamed", "failed", Some("signature_files_differ")),
    ("other-key", "failed", Some("signature_untrusted")),
    ("forged", "failed", Some("signature_invalid")),
    ("truncated", "failed", Some("signature_malformed")),
    ("oversized", "failed", Some("signature_malformed")),
    ("mistyped", "failed", Some("signature_malformed")),
    ("unsigned", "unsigned", None),
];

/// The keys, certificates and signed models of one test, in a temporary directory.
struct Corpus {
    _dir: tempfile::TempDir,
    root: PathBuf,
    models: PathBuf,
    trusted_pub: PathBuf,
    ca_file: PathBuf,
}

fn model_signing(args: &[&str]) {
    let tool = venv_root().join("signing/bin/model_signing");
    let output = Command::new(&tool).args(args).output().expect("model_signing runs");
    assert!(output.status.success(), "model_signing {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

fn write_key(root: &Path, name: &str) -> (PathBuf, PathBuf, KeyPair) {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let (private, public) = (root.join(format!("{name}.key")), root.join(format!("{name}.pub")));
    std::fs::write(&private, key.serialize_pem()).unwrap();
    std::fs::write(&public, key.public_key_pem()).unwrap();
    (private, public, key)
}

impl Corpus {
    fn new() -> Corpus {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let models = root.join("models");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
        let (trusted, trusted_pub, _) = write_key(&root, "publisher");
        let (stranger, _, _) = write_key(&root, "stranger");
        let sign_with = |key: &Path, dir: &Path| {
            let signature = dir.join("model.sig");
            model_signing(&["sign", "key", "--private_key", path(key), "--signature", path(&signature), path(dir)]);
        };
        let checkpoint = |name: &str| {
            let dir = models.join(name);
            copy_dir(&repo.join("hf/tiny-llama"), &dir);
            std::fs::write(dir.join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
            dir
        };
        sign_with(&trusted, &checkpoint("key-sharded"));
        copy_dir(&repo.join("gguf/tiny"), &models.join("gguf"));
        sign_with(&trusted, &models.join("gguf"));
        checkpoint("unsigned");

        // A CA, and a certificate it issued to sign models with.
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "Model Signing CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca_file = root.join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let (leaf_key_file, _, leaf_key) = write_key(&root, "ml-team");
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "ML Team");
        params.subject_alt_names = vec![SanType::Rfc822Name("ml-team@example.com".try_into().unwrap())];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        let leaf = params.signed_by(&leaf_key, &ca).unwrap();
        let leaf_file = root.join("ml-team.crt");
        std::fs::write(&leaf_file, leaf.pem()).unwrap();
        let zt = models.join("cert-zt");
        std::fs::create_dir_all(&zt).unwrap();
        std::fs::copy(repo.join("demo/dense.zt"), zt.join("dense.zt")).unwrap();
        model_signing(&[
            "sign",
            "certificate",
            "--private_key",
            path(&leaf_key_file),
            "--signing_certificate",
            path(&leaf_file),
            "--certificate_chain",
            path(&ca_file),
            "--signature",
            path(&zt.join("model.sig")),
            path(&zt),
        ]);

        // Tampered after signing.
        let signed = |name: &str, key: &Path| {
            let dir = checkpoint(name);
            sign_with(key, &dir);
            dir
        };
        let byte = signed("byte", &trusted);
        let shard = byte.join("model-00002-of-00002.safetensors");
        let mut bytes = std::fs::read(&shard).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        std::fs::write(&shard, bytes).unwrap();
        std::fs::write(signed("added", &trusted).join("README.md"), "# added after signing\n").unwrap();
        std::fs::remove_file(signed("removed", &trusted).join("config.json")).unwrap();
        let renamed = signed("renamed", &trusted);
        std::fs::rename(renamed.join("config.json"), renamed.join("config.v2.json")).unwrap();
        signed("other-key", &stranger);
        // The trusted key's hint, over a signature another key made of the same statement.
        let forged = signed("forged", &trusted);
        let mut bundle: Value = serde_json::from_slice(&std::fs::read(forged.join("model.sig")).unwrap()).unwrap();
        let b64 = base64::engine::general_purpose::STANDARD;
        let payload = b64.decode(bundle["dsseEnvelope"]["payload"].as_str().unwrap()).unwrap();
        let stranger_key = std::fs::read_to_string(&stranger).unwrap();
        let der = rustls_pki_der(&stranger_key);
        let other =
            aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(&aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING, &der)
                .unwrap();
        let pae = ztserve::format::model_signature::pae(&payload);
        let signature = other.sign(&aws_lc_rs::rand::SystemRandom::new(), &pae).unwrap();
        bundle["dsseEnvelope"]["signatures"][0]["sig"] = b64.encode(signature.as_ref()).into();
        std::fs::write(forged.join("model.sig"), serde_json::to_vec(&bundle).unwrap()).unwrap();
        // Broken bundles.
        let truncated = signed("truncated", &trusted).join("model.sig");
        let whole = std::fs::read(&truncated).unwrap();
        std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
        let oversized = signed("oversized", &trusted).join("model.sig");
        let mut padded = std::fs::read(&oversized).unwrap();
        padded.resize(MAX_SIGNATURE_BYTES as usize + 1, b' ');
        std::fs::write(&oversized, padded).unwrap();
        let mistyped = signed("mistyped", &trusted).join("model.sig");
        let mut bundle: Value = serde_json::from_slice(&std::fs::read(&mistyped).unwrap()).unwrap();
        bundle["dsseEnvelope"]["signatures"] = "one".into();
        std::fs::write(&mistyped, serde_json::to_vec(&bundle).unwrap()).unwrap();
        Corpus { _dir: dir, root, models, trusted_pub, ca_file }
    }

    fn config(&self, policy: SigningPolicy) -> Config {
        let mut config = Config::serving(vec![SourceSpec::local(&self.models)]);
        config.signing.policy = policy;
        config.signing.public_keys = vec![self.trusted_pub.clone()];
        config.signing.ca_file = Some(self.ca_file.clone());
        config.signing.max_signature_bytes = MAX_SIGNATURE_BYTES;
        config
    }
}

/// A PKCS#8 PEM's DER.
fn rustls_pki_der(pem: &str) -> Vec<u8> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(body).unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `/models` once no signature is pending any more: each model's entry by id.
async fn settled_models(address: &str) -> serde_json::Map<String, Value> {
    // Every verdict needs only local files hashed: far under the bound, which only ends a hang.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = request_async(address, "/models", &[]).await.json();
        let models: serde_json::Map<String, Value> = listed["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| (m["id"].as_str().unwrap().to_owned(), m.clone()))
            .collect();
        if models.values().all(|m| m["signature"]["state"] != "pending") {
            return models;
        }
        assert!(Instant::now() < deadline, "signatures still pending: {models:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The status of a GET of `path`, with `headers`.
async fn status(address: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    request_async(address, path, headers).await.status
}

const MANIFEST: (&str, &str) = ("Accept", "application/vnd.oci.image.manifest.v1+json");

#[tokio::test(flavor = "multi_thread")]
async fn models_signed_by_model_signing_serve_as_verified_and_each_tampering_is_refused_with_its_reason() {
    let corpus = Corpus::new();
    for policy in [SigningPolicy::Required, SigningPolicy::IfSigned] {
        let server = InProcess::start(corpus.config(policy), true).await;
        let (http, s3) = (server.address.clone(), server.s3_address.clone().unwrap());
        let models = settled_models(&http).await;
        for (id, state, reason) in EXPECTED {
            let entry = &models[*id];
            assert_eq!(entry["signature"]["state"], *state, "{policy:?} {id}: {entry}");
            assert_eq!(entry["signature"]["policy"], policy_name(policy));
            assert!(entry["signature"]["checked_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{entry}");
            let refused = reason.is_some() || (*state == "unsigned" && policy == SigningPolicy::Required);
            assert_eq!(entry["status"], if refused { "broken" } else { "ok" }, "{policy:?} {id}: {entry}");
            if let Some(reason) = reason {
                assert_eq!(entry["signature"]["reason"]["code"], *reason, "{id}: {entry}");
                assert_eq!(entry["reason"]["code"], *reason, "{id}: {entry}");
                // Refused on every protocol: the HTTP contract, its view, the Hub, the registry, S3.
                let manifest = request_async(&http, &format!("/models/{id}"), &[]).await;
                assert_eq!(manifest.status, 422, "{id}");
                assert_eq!(manifest.json()["error"]["code"], "signature_failed");
                assert_eq!(manifest.json()["error"]["reason"], *reason);
                for path in [
                    format!("/models/{id}/files/config.json"),
                    format!("/models/{id}/model.safetensors.index.json"),
                    format!("/hf/api/models/local/{id}"),
                    format!("/hf/local/{id}/resolve/main/model.safetensors.index.json"),
                    format!("/v2/{id}/manifests/latest"),
                ] {
                    assert_eq!(status(&http, &path, &[MANIFEST]).await, 422, "{policy:?} {path}");
                }
                let from_s3 = request_async(&s3, &format!("/models/{id}/model.safetensors.index.json"), &[]).await;
                assert!((400..500).contains(&from_s3.status), "{id} from S3: {}", from_s3.status);
                assert!(!String::from_utf8_lossy(&from_s3.body).contains("weight_map"));
            }
        }
        if policy == SigningPolicy::Required {
            let refused = request_async(&http, "/models/unsigned", &[]).await;
            assert_eq!((refused.status, refused.json()["error"]["code"].clone()), (422, "unsigned_model".into()));
        }
        // What verifies serves, on every protocol, saying who signed it.
        let manifest = request_async(&http, "/models/key-sharded", &[]).await;
        assert_eq!(manifest.status, 200);
        let signature = &manifest.json()["signature"];
        assert_eq!((&signature["state"], &signature["signer"]), (&"verified".into(), &"key publisher.pub".into()));
        assert_eq!(signature["files"], 4);
        let zt = &models["cert-zt/dense"]["signature"]["signer"];
        assert!(zt.as_str().unwrap().contains("ML Team") && zt.as_str().unwrap().contains("ml-team@example.com"));
        for path in [
            "/models/key-sharded/files/config.json",
            "/models/key-sharded/model.safetensors.index.json",
            "/models/cert-zt%2Fdense/model.safetensors",
        ] {
            assert_eq!(status(&http, path, &[]).await, 200, "{path}");
        }
        // `main` redirects to the commit, as the Hub's does.
        for path in ["/hf/local/key-sharded/resolve/main/model.sig", "/hf/local/gguf/resolve/main/tiny-F16.gguf"] {
            assert_eq!(status(&http, path, &[]).await, 302, "{path}");
        }
        let info = request_async(&http, "/hf/api/models/local/key-sharded", &[]).await.json();
        assert_eq!(info["signature"]["state"], "verified");
        let artifact = request_async(&http, "/v2/key-sharded/manifests/latest", &[MANIFEST]).await;
        assert_eq!(artifact.status, 200);
        let annotations = &artifact.json()["annotations"];
        assert_eq!(annotations["dev.ztserve.signature.state"], "verified");
        assert_eq!(annotations["dev.ztserve.signature.signer"], "key publisher.pub");
        assert_eq!(status(&s3, "/models-stored/key-sharded/model.sig", &[]).await, 200);
        let listing = String::from_utf8(request_async(&s3, "/models?list-type=2", &[]).await.body).unwrap();
        assert!(listing.contains("<Key>key-sharded/config.json</Key>") && !listing.contains("<Key>byte/"));
        let failed = EXPECTED.iter().filter(|(_, state, _)| *state == "failed").count();
        let scraped = String::from_utf8(request_async(&http, "/metrics", &[]).await.body).unwrap();
        assert!(scraped.contains(&format!("ztserve_model_signatures{{state=\"failed\"}} {failed}")), "{scraped}");
        assert!(scraped.contains("ztserve_model_signatures{state=\"verified\"} 4"));
        assert!(scraped.contains("ztserve_model_signatures{state=\"pending\"} 0"));
        server.stop().await.unwrap();
    }

    // Under `none` nothing is read and everything serves as before.
    let server = InProcess::start(corpus.config(SigningPolicy::None), false).await;
    let listed = request_async(&server.address, "/models", &[]).await.json();
    for entry in listed["models"].as_array().unwrap() {
        assert_eq!(entry["status"], "ok", "{entry}");
        assert!(entry.get("signature").is_none(), "{entry}");
    }
    assert_eq!(status(&server.address, "/models/byte/files/model-00002-of-00002.safetensors", &[]).await, 200);
    assert!(request_async(&server.address, "/models/byte", &[]).await.json().get("signature").is_none());
    server.stop().await.unwrap();

    // `ztserve verify DIR` reaches each verdict with the same code.
    let check = ztserve::tools::SignatureCheck {
        public_keys: vec![corpus.trusted_pub.clone()],
        ca_file: Some(corpus.ca_file.clone()),
        signature_file: "model.sig".into(),
        max_signature_bytes: MAX_SIGNATURE_BYTES,
    };
    for dir in [
        "key-sharded",
        "cert-zt",
        "gguf",
        "byte",
        "added",
        "removed",
        "renamed",
        "other-key",
        "forged",
        "truncated",
        "oversized",
        "mistyped",
        "unsigned",
    ] {
        let mut out = Vec::new();
        let valid = ztserve::tools::verify_signature(&corpus.models.join(dir), &check, true, &mut out).unwrap();
        let report: Value = serde_json::from_slice(&out).unwrap();
        let id = if dir == "cert-zt" {
            "cert-zt/dense"
        } else if dir == "gguf" {
            "gguf/tiny-F16"
        } else {
            dir
        };
        let (_, state, reason) = EXPECTED.iter().find(|(m, _, _)| *m == id).unwrap();
        assert_eq!((report["state"].as_str(), valid), (Some(*state), *state == "verified"), "{dir}: {report}");
        assert_eq!(report["reason"]["code"].as_str(), *reason, "{dir}: {report}");
    }
}

fn policy_name(policy: SigningPolicy) -> &'static str {
    policy.as_str()
}

#[tokio::test(flavor = "multi_thread")]
async fn copies_taken_through_the_hub_api_and_the_s3_endpoint_verify_with_model_signing() {
    let corpus = Corpus::new();
    let server = InProcess::start(corpus.config(SigningPolicy::Required), true).await;
    let (http, s3) = (server.address.clone(), server.s3_address.clone().unwrap());
    settled_models(&http).await;
    let work = corpus.root.join("copies");
    std::fs::create_dir_all(&work).unwrap();
    let (hub, s3_url) = (format!("http://{http}/hf"), format!("http://{s3}"));
    let out = tokio::task::spawn_blocking(move || {
        run_interop_script(
            "signing",
            "signing_copies.py",
            &[Path::new(&hub), Path::new(&s3_url), &work, &corpus.trusted_pub, &corpus.ca_file],
        )
    })
    .await
    .unwrap();
    let verified: Value = serde_json::from_str(out.trim().lines().last().unwrap()).unwrap();
    assert_eq!(
        verified,
        serde_json::json!({
            "hub:local/key-sharded": "verified",
            "hub:local/gguf": "verified",
            "s3:key-sharded": "verified",
            "s3:cert-zt/dense": "verified",
        })
    );
    server.stop().await.unwrap();
}
