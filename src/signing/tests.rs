//! Signatures made here with aws-lc-rs keys and rcgen certificates, in the bundle and statement
//! layout `model_signing` writes (the real tool signs in `tests/it/signing.rs`).

use aws_lc_rs::encoding::AsDer as _;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair as _};
use base64::Engine as _;
use serde_json::{Value, json};
use sha2::Digest as _;

use super::{SignatureError, Trust};
use crate::format::model_signature::{pae, pae_compat};

const LIMIT: u64 = 1 << 20;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sha(bytes: &[u8]) -> [u8; 32] {
    sha2::Sha256::digest(bytes).into()
}

/// A statement of `files` as `model_signing` 1.x writes one, serialized by files.
fn statement(files: &[(&str, &[u8])]) -> Value {
    let mut sorted: Vec<(&str, [u8; 32])> = files.iter().map(|(n, b)| (*n, sha(b))).collect();
    sorted.sort();
    let mut root = sha2::Sha256::new();
    for (_, digest) in &sorted {
        root.update(digest);
    }
    json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{ "name": "model", "digest": { "sha256": hex::encode(root.finalize()) } }],
        "predicateType": "https://model_signing/signature/v1.0",
        "predicate": {
            "serialization": {
                "method": "files", "hash_type": "sha256", "allow_symlinks": false,
                "ignore_paths": ["model.sig", ".git", ".gitignore", ".gitattributes", ".github"],
            },
            "resources": sorted.iter().map(|(name, digest)| json!({
                "name": name, "algorithm": "sha256", "digest": hex::encode(digest),
            })).collect::<Vec<_>>(),
        },
    })
}

fn bundle(material: Value, payload: &[u8], signature: &[u8]) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": b64(payload),
            "payloadType": "application/vnd.in-toto+json",
            "signatures": [{ "sig": b64(signature), "keyid": "" }],
        },
    }))
    .unwrap()
}

/// The SHA-256 of `spki` as PEM, written as `model_signing` writes it.
fn hint(spki: &[u8]) -> String {
    let encoded = b64(spki);
    let lines: Vec<&str> = encoded.as_bytes().chunks(64).map(|l| std::str::from_utf8(l).unwrap()).collect();
    let pem = format!("-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n", lines.join("\n"));
    hex::encode(sha(pem.as_bytes()))
}

struct Signer {
    key: EcdsaKeyPair,
    spki: Vec<u8>,
}

impl Signer {
    fn new(alg: &'static signature::EcdsaSigningAlgorithm) -> Signer {
        let key = EcdsaKeyPair::generate(alg).unwrap();
        let spki = key.public_key().as_der().unwrap().as_ref().to_vec();
        Signer { key, spki }
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.key.sign(&SystemRandom::new(), message).unwrap().as_ref().to_vec()
    }

    /// A key-signed bundle of `statement`.
    fn bundle(&self, statement: &Value) -> Vec<u8> {
        let payload = serde_json::to_vec_pretty(statement).unwrap();
        bundle(
            json!({ "publicKey": { "hint": hint(&self.spki) }, "tlogEntries": [] }),
            &payload,
            &self.sign(&pae(&payload)),
        )
    }

    /// This key trusted, as a PEM file in `dir`.
    fn trust(&self, dir: &std::path::Path, name: &str) -> Trust {
        let path = dir.join(name);
        let pem = format!("-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n", b64(&self.spki));
        std::fs::write(&path, pem).unwrap();
        Trust::load(&[path], None).unwrap()
    }
}

#[test]
fn a_key_signature_verifies_on_each_curve_and_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    for alg in [
        &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
        &signature::ECDSA_P521_SHA512_ASN1_SIGNING,
    ] {
        let signer = Signer::new(alg);
        let trust = signer.trust(dir.path(), "publisher.pub");
        let signed = trust.verify(&signer.bundle(&statement(&[("a.safetensors", b"weights")])), LIMIT).unwrap();
        assert_eq!(signed.signer, "key publisher.pub");
        assert_eq!(signed.file_count(), 1);
        signed.match_names(["a.safetensors"]).unwrap();
        signed.check_digest("a.safetensors", &sha(b"weights")).unwrap();
    }
}

#[test]
fn an_ed25519_signature_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let spki = key.public_key().as_der().unwrap().as_ref().to_vec();
    let path = dir.path().join("ed.pub");
    std::fs::write(&path, format!("-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n", b64(&spki))).unwrap();
    let trust = Trust::load(&[path], None).unwrap();
    let payload = serde_json::to_vec(&statement(&[("m.gguf", b"gguf")])).unwrap();
    let signed = bundle(json!({ "publicKey": { "hint": hint(&spki) } }), &payload, key.sign(&pae(&payload)).as_ref());
    assert_eq!(trust.verify(&signed, LIMIT).unwrap().signer, "key ed.pub");
}

#[test]
fn another_key_a_changed_statement_and_no_keys_are_each_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (trusted, other) = (
        Signer::new(&signature::ECDSA_P256_SHA256_ASN1_SIGNING),
        Signer::new(&signature::ECDSA_P256_SHA256_ASN1_SIGNING),
    );
    let trust = trusted.trust(dir.path(), "trusted.pub");
    let by_other = other.bundle(&statement(&[("a", b"a")]));
    assert!(
        matches!(trust.verify(&by_other, LIMIT), Err(SignatureError::Untrusted(m)) if m.contains(&hint(&other.spki)))
    );
    // The trusted key's hint over a statement it did not sign.
    let payload = serde_json::to_vec(&statement(&[("a", b"a")])).unwrap();
    let forged = bundle(json!({ "publicKey": { "hint": hint(&trusted.spki) } }), &payload, &other.sign(&pae(&payload)));
    assert!(matches!(trust.verify(&forged, LIMIT), Err(SignatureError::Invalid(_))));
    let nothing = Trust::load(&[], None).unwrap();
    assert!(matches!(nothing.verify(&by_other, LIMIT), Err(SignatureError::Untrusted(_))));
}

#[test]
fn a_signature_of_model_signing_0_2_verifies_over_its_encoding() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(&signature::ECDSA_P256_SHA256_ASN1_SIGNING);
    let trust = signer.trust(dir.path(), "k.pub");
    let payload = serde_json::to_vec_pretty(&statement(&[("it's", b"x")])).unwrap();
    let compat = pae_compat(&payload);
    assert!(compat.starts_with(b"DSSEV1 28 application/vnd.in-toto+json "));
    assert!(String::from_utf8_lossy(&compat).contains(" b'{\\n"));
    let signed = bundle(json!({ "publicKey": {} }), &payload, &signer.sign(&compat));
    assert_eq!(trust.verify(&signed, LIMIT).unwrap().signer, "key k.pub");
}

#[test]
fn a_certificate_signature_verifies_to_the_configured_ca_and_shows_its_identity() {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
    };
    let dir = tempfile::tempdir().unwrap();
    let ca = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
    };
    let (ca, stranger) = (ca("Model CA"), ca("Other CA"));
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let trust = Trust::load(&[], Some(&ca_file)).unwrap();
    let leaf = |issuer: &CertifiedIssuer<'static, KeyPair>, usages: Vec<KeyUsagePurpose>| {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "ML Team");
        params.subject_alt_names = vec![SanType::Rfc822Name("ml@example.com".try_into().unwrap())];
        params.key_usages = usages;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
        let certificate = params.signed_by(&key, issuer).unwrap();
        let signer =
            EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &key.serialize_der()).unwrap();
        (certificate.der().to_vec(), signer)
    };
    let payload = serde_json::to_vec(&statement(&[("dense.zt", b"zt")])).unwrap();
    let signed_by = |(der, key): (Vec<u8>, EcdsaKeyPair)| {
        let signature = key.sign(&SystemRandom::new(), &pae(&payload)).unwrap();
        let material = json!({ "x509CertificateChain": { "certificates": [{ "rawBytes": b64(&der) }] } });
        bundle(material, &payload, signature.as_ref())
    };
    let good = signed_by(leaf(&ca, vec![KeyUsagePurpose::DigitalSignature]));
    let signed = trust.verify(&good, LIMIT).unwrap();
    assert!(signed.signer.contains("ML Team") && signed.signer.contains("email:ml@example.com"), "{}", signed.signer);
    let foreign = signed_by(leaf(&stranger, vec![KeyUsagePurpose::DigitalSignature]));
    assert!(matches!(trust.verify(&foreign, LIMIT), Err(SignatureError::Untrusted(m)) if m.contains("does not chain")));
    // Keys only: a certificate signature has nothing to chain to.
    let keys_only = Trust::load(&[], None).unwrap();
    assert!(matches!(keys_only.verify(&good, LIMIT), Err(SignatureError::Untrusted(m)) if m.contains("ca_file")));
}

#[test]
fn malformed_oversized_keyless_and_unsupported_bundles_are_refused_with_their_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(&signature::ECDSA_P256_SHA256_ASN1_SIGNING);
    let trust = signer.trust(dir.path(), "k.pub");
    let good = signer.bundle(&statement(&[("a", b"a")]));
    assert!(matches!(trust.verify(&good, 10), Err(SignatureError::TooLarge { limit: 10, .. })));
    assert!(matches!(trust.verify(&good[..good.len() / 2], LIMIT), Err(SignatureError::Malformed(_))));
    let mut wrong: Value = serde_json::from_slice(&good).unwrap();
    wrong["dsseEnvelope"]["signatures"] = json!("not a list");
    let error = trust.verify(&serde_json::to_vec(&wrong).unwrap(), LIMIT).unwrap_err();
    assert!(matches!(&error, SignatureError::Malformed(m) if m.contains("invalid type")), "{error}");
    assert_eq!(error.code(), "signature_malformed");
    let mut deep = String::new();
    for _ in 0..10_000 {
        deep.push('[');
    }
    let deep = format!("{{\"mediaType\":{deep}");
    assert!(matches!(trust.verify(deep.as_bytes(), LIMIT), Err(SignatureError::Malformed(_))));
    let mut keyless: Value = serde_json::from_slice(&good).unwrap();
    keyless["verificationMaterial"] = json!({ "certificate": { "rawBytes": "AA==" }, "tlogEntries": [{}] });
    assert!(matches!(trust.verify(&serde_json::to_vec(&keyless).unwrap(), LIMIT), Err(SignatureError::Unsupported(_))));
    for (field, value) in [("method", "shards"), ("hash_type", "blake3")] {
        let mut unsupported = statement(&[("a", b"a")]);
        unsupported["predicate"]["serialization"][field] = json!(value);
        assert!(matches!(trust.verify(&signer.bundle(&unsupported), LIMIT), Err(SignatureError::Unsupported(_))));
    }
    let mut inconsistent = statement(&[("a", b"a")]);
    inconsistent["subject"][0]["digest"]["sha256"] = json!(hex::encode([0u8; 32]));
    assert!(matches!(trust.verify(&signer.bundle(&inconsistent), LIMIT), Err(SignatureError::Statement(_))));
    let mut escaping = statement(&[("../etc/passwd", b"a")]);
    escaping["predicate"]["resources"][0]["name"] = json!("../etc/passwd");
    assert!(matches!(trust.verify(&signer.bundle(&escaping), LIMIT), Err(SignatureError::Statement(_))));
}

#[test]
fn files_are_matched_as_model_signing_hashes_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let signer = Signer::new(&signature::ECDSA_P256_SHA256_ASN1_SIGNING);
    let trust = signer.trust(dir.path(), "k.pub");
    let signed = trust.verify(&signer.bundle(&statement(&[("a", b"a"), ("sub/b", b"b")])), LIMIT).unwrap();
    for left_out in ["model.sig", ".git/HEAD", ".gitattributes", ".github/workflows/x.yml"] {
        assert!(signed.ignores(left_out, "model.sig"), "{left_out}");
    }
    assert!(!signed.ignores(".gitkeep", "model.sig") && !signed.ignores("model.sig2", "model.sig"));
    assert!(signed.ignores("custom.sig", "custom.sig"));
    signed.match_names(["sub/b", "a"]).unwrap();
    let added = signed.match_names(["a", "sub/b", "README.md"]).unwrap_err();
    assert_eq!(added.code(), "signature_unsigned_file");
    assert_eq!(signed.match_names(["a"]).unwrap_err().code(), "signature_missing_file");
    let renamed = signed.match_names(["a", "sub/c"]).unwrap_err();
    assert_eq!(renamed.code(), "signature_files_differ");
    assert_eq!(
        renamed.to_string(),
        "files not in the signature: \"sub/c\"; files the signature lists are missing: \"sub/b\""
    );
    let changed = signed.check_digest("a", &sha(b"A")).unwrap_err();
    assert_eq!(changed.code(), "signature_digest_mismatch");
    assert!(changed.to_string().contains(&hex::encode(sha(b"a"))));
}
