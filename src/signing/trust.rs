//! What is trusted to sign models, and the check of a bundle's signature against it: public
//! keys (ECDSA P-256, P-384, P-521 with the hash `model_signing` pairs with each curve; Ed25519)
//! matched by the hint the bundle carries, and signing certificates chained by rustls-webpki to
//! a configured CA at the time the certificate was issued (as `model_signing` checks them),
//! allowed to sign (digital signature key usage or the code-signing purpose). The signature is
//! over the DSSE pre-authentication encoding, or the one `model_signing` 0.2 wrote.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, SubjectPublicKeyInfoDer, TrustAnchor, UnixTime};
use sha2::Digest as _;
use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
use x509_parser::x509::SubjectPublicKeyInfo;

use super::{SignatureError, SignedModel};
use crate::format::model_signature::{Bundle, Material, pae, pae_compat};

/// The code-signing purpose, 1.3.6.1.5.5.7.3.3, as DER content octets.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// A trust file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub(crate) struct TrustError {
    pub(crate) path: PathBuf,
    pub(crate) reason: String,
}

/// A key's algorithm, with the hash `model_signing` signs with on its curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    EcdsaP256,
    EcdsaP384,
    EcdsaP521,
    Ed25519,
}

/// A public key as signatures are checked with it.
#[derive(Debug, Clone)]
struct PublicKey {
    kind: KeyKind,
    /// The EC point, or the Ed25519 key.
    bytes: Vec<u8>,
}

impl PublicKey {
    /// The key of a DER SubjectPublicKeyInfo.
    fn of_spki(der: &[u8]) -> Result<PublicKey, String> {
        let (_, spki) = SubjectPublicKeyInfo::from_der(der).map_err(|e| format!("not a public key: {e}"))?;
        let algorithm = spki.algorithm.algorithm.to_id_string();
        let kind = match algorithm.as_str() {
            "1.2.840.10045.2.1" => {
                let curve = spki.algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok()).map(|o| o.to_id_string());
                match curve.as_deref() {
                    Some("1.2.840.10045.3.1.7") => KeyKind::EcdsaP256,
                    Some("1.3.132.0.34") => KeyKind::EcdsaP384,
                    Some("1.3.132.0.35") => KeyKind::EcdsaP521,
                    other => return Err(format!("an EC key on curve {other:?}, not P-256, P-384 or P-521")),
                }
            }
            "1.3.101.112" => KeyKind::Ed25519,
            other => return Err(format!("a key of algorithm {other}, not ECDSA or Ed25519")),
        };
        Ok(PublicKey { kind, bytes: spki.subject_public_key.data.to_vec() })
    }

    /// Whether `signature` is this key's over `message`.
    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        use aws_lc_rs::signature;
        let algorithm: &'static dyn signature::VerificationAlgorithm = match self.kind {
            KeyKind::EcdsaP256 => &signature::ECDSA_P256_SHA256_ASN1,
            KeyKind::EcdsaP384 => &signature::ECDSA_P384_SHA384_ASN1,
            KeyKind::EcdsaP521 => &signature::ECDSA_P521_SHA512_ASN1,
            KeyKind::Ed25519 => &signature::ED25519,
        };
        signature::UnparsedPublicKey::new(algorithm, &self.bytes).verify(message, signature).is_ok()
    }

    /// Whether `signature` is this key's over `payload`'s encoding, today's or 0.2's.
    fn signed(&self, payload: &[u8], signature: &[u8]) -> bool {
        self.verifies(&pae(payload), signature) || self.verifies(&pae_compat(payload), signature)
    }
}

/// One trusted public key.
#[derive(Debug, Clone)]
struct TrustedKey {
    /// Its file's name, as signers are shown.
    name: String,
    /// The SHA-256 (hex) of its PEM as `model_signing` writes it: the bundle's hint.
    hint: String,
    key: PublicKey,
}

/// The keys and CAs signatures are checked against.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trust {
    keys: Vec<TrustedKey>,
    anchors: Vec<TrustAnchor<'static>>,
}

impl Trust {
    /// The trust of `public_keys` (PEM files) and `ca_file` (a PEM bundle), each checked now.
    pub(crate) fn load(public_keys: &[PathBuf], ca_file: Option<&Path>) -> Result<Trust, TrustError> {
        let mut trust = Trust::default();
        for path in public_keys {
            let fail = |reason: String| TrustError { path: path.clone(), reason };
            let der = SubjectPublicKeyInfoDer::from_pem_file(path)
                .map_err(|e| fail(format!("cannot read a PEM public key: {e}")))?;
            let key = PublicKey::of_spki(der.as_ref()).map_err(fail)?;
            let name =
                path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
            trust.keys.push(TrustedKey { name, hint: pem_hint(der.as_ref()), key });
        }
        if let Some(path) = ca_file {
            let fail = |reason: String| TrustError { path: path.to_owned(), reason };
            let certificates = CertificateDer::pem_file_iter(path)
                .map_err(|e| fail(format!("cannot read: {e}")))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| fail(format!("not a PEM bundle of certificates: {e}")))?;
            if certificates.is_empty() {
                return Err(fail("holds no certificate".into()));
            }
            for certificate in &certificates {
                let anchor = webpki::anchor_from_trusted_cert(certificate)
                    .map_err(|e| fail(format!("a certificate that cannot be a CA: {e}")))?;
                trust.anchors.push(anchor.to_owned());
            }
        }
        Ok(trust)
    }

    /// Checks signature file `bytes` (at most `limit` of them): its signature by a trusted
    /// signer, then its statement.
    pub(crate) fn verify(&self, bytes: &[u8], limit: u64) -> Result<SignedModel, SignatureError> {
        let bundle = Bundle::parse(bytes, limit)?;
        let signer = match &bundle.material {
            Material::PublicKey { hint } => self.check_with_key(hint.as_deref(), &bundle)?,
            Material::CertificateChain(chain) => self.check_with_certificate(chain, &bundle)?,
        };
        SignedModel::from_payload(&bundle.payload, signer)
    }

    fn check_with_key(&self, hint: Option<&str>, bundle: &Bundle) -> Result<String, SignatureError> {
        if self.keys.is_empty() {
            return Err(SignatureError::Untrusted("signed with a key, and signing.public_keys names none".into()));
        }
        let named: Vec<&TrustedKey> = match hint {
            Some(hint) => self.keys.iter().filter(|k| k.hint.eq_ignore_ascii_case(hint)).collect(),
            None => self.keys.iter().collect(),
        };
        if let (Some(hint), true) = (hint, named.is_empty()) {
            return Err(SignatureError::Untrusted(format!(
                "signed with the key whose PEM has SHA-256 {hint}, which is none of signing.public_keys"
            )));
        }
        match named.iter().find(|k| k.key.signed(&bundle.payload, &bundle.signature)) {
            Some(key) => Ok(format!("key {}", key.name)),
            None if hint.is_some() => {
                Err(SignatureError::Invalid(format!("the statement is not what key {} signed", named[0].name)))
            }
            None => Err(SignatureError::Untrusted(
                "no key of signing.public_keys verifies it (the bundle does not say which key signed)".into(),
            )),
        }
    }

    fn check_with_certificate(&self, chain: &[Vec<u8>], bundle: &Bundle) -> Result<String, SignatureError> {
        if self.anchors.is_empty() {
            return Err(SignatureError::Untrusted("signed with a certificate, and signing.ca_file is not set".into()));
        }
        let (_, leaf) = X509Certificate::from_der(&chain[0])
            .map_err(|e| SignatureError::Malformed(format!("the signing certificate: {e}")))?;
        let signer = certificate_identity(&leaf);
        let issued = leaf.validity().not_before.timestamp().max(0) as u64;
        let der = CertificateDer::from(chain[0].as_slice());
        let end_entity = webpki::EndEntityCert::try_from(&der)
            .map_err(|e| SignatureError::Malformed(format!("the signing certificate: {e}")))?;
        let intermediates: Vec<CertificateDer<'_>> =
            chain[1..].iter().map(|c| CertificateDer::from(c.as_slice())).collect();
        end_entity
            .verify_for_usage(
                webpki::ALL_VERIFICATION_ALGS,
                &self.anchors,
                &intermediates,
                UnixTime::since_unix_epoch(std::time::Duration::from_secs(issued)),
                webpki::KeyUsage::required_if_present(CODE_SIGNING),
                None,
                None,
            )
            .map_err(|e| SignatureError::Untrusted(format!("{signer} does not chain to signing.ca_file: {e}")))?;
        let digital_signature = matches!(leaf.key_usage(), Ok(Some(usage)) if usage.value.digital_signature());
        let code_signing = matches!(leaf.extended_key_usage(), Ok(Some(usage)) if usage.value.code_signing);
        if !digital_signature && !code_signing {
            return Err(SignatureError::Untrusted(format!(
                "{signer} may not sign: it has neither the digital signature key usage nor the code-signing purpose"
            )));
        }
        let key = PublicKey::of_spki(leaf.public_key().raw)
            .map_err(|e| SignatureError::Unsupported(format!("the signing certificate's key: {e}")))?;
        if !key.signed(&bundle.payload, &bundle.signature) {
            return Err(SignatureError::Invalid(format!("the statement is not what {signer} signed")));
        }
        Ok(signer)
    }
}

/// The SHA-256 (hex) of `spki` written as PEM the way `model_signing` (Python's `cryptography`)
/// writes a public key: lines of 64 base64 characters, each ending in a newline.
pub(super) fn pem_hint(spki: &[u8]) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(spki);
    let mut pem = String::from("-----BEGIN PUBLIC KEY-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        pem.push('\n');
    }
    pem.push_str("-----END PUBLIC KEY-----\n");
    hex::encode(sha2::Sha256::digest(pem.as_bytes()))
}

/// A signing certificate as a signer is shown: its subject, and its e-mail, URI and DNS names.
fn certificate_identity(certificate: &X509Certificate<'_>) -> String {
    let mut names = Vec::new();
    if let Ok(Some(san)) = certificate.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::RFC822Name(email) => names.push(format!("email:{email}")),
                GeneralName::URI(uri) => names.push(format!("uri:{uri}")),
                GeneralName::DNSName(dns) => names.push(format!("dns:{dns}")),
                _ => {}
            }
        }
    }
    let subject = certificate.subject().to_string();
    if names.is_empty() {
        format!("certificate {subject:?}")
    } else {
        format!("certificate {subject:?} ({})", names.join(", "))
    }
}
