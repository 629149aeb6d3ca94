//! The signature file: a Sigstore bundle (media type v0.3) whose verification material is a
//! public key's hint, a certificate chain, or (keyless) one certificate, and whose content is
//! a DSSE envelope of one signature. Typed, so a value of the wrong JSON type is refused by
//! name; the file's size is bounded before it is read and `serde_json` bounds its depth.

use base64::Engine as _;
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::SignatureError;

/// The only bundle media type `model_signing` 1.x writes and reads.
pub(super) const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The DSSE payload type of an in-toto statement.
pub(super) const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The most certificates a chain may hold.
const MAX_CHAIN: usize = 8;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct BundleJson {
    media_type: String,
    verification_material: MaterialJson,
    dsse_envelope: Option<EnvelopeJson>,
    message_signature: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MaterialJson {
    public_key: Option<PublicKeyJson>,
    x509_certificate_chain: Option<ChainJson>,
    certificate: Option<CertificateJson>,
}

#[derive(Deserialize)]
struct PublicKeyJson {
    hint: Option<String>,
}

#[derive(Deserialize)]
struct ChainJson {
    certificates: Vec<CertificateJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CertificateJson {
    raw_bytes: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct EnvelopeJson {
    payload: String,
    payload_type: String,
    signatures: Vec<SignatureJson>,
}

#[derive(Deserialize)]
struct SignatureJson {
    sig: String,
}

/// Who the bundle says signed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Material {
    /// A public key, by the SHA-256 (hex) of its PEM (absent in bundles of older releases).
    PublicKey { hint: Option<String> },
    /// A signing certificate (DER), then the certificates up to a CA.
    CertificateChain(Vec<Vec<u8>>),
}

/// A bundle's signed content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub material: Material,
    /// The DSSE payload, decoded: the in-toto statement's JSON.
    pub payload: Vec<u8>,
    /// The one signature over the payload's pre-authentication encoding.
    pub signature: Vec<u8>,
}

fn malformed(detail: impl Into<String>) -> SignatureError {
    SignatureError::Malformed(detail.into())
}

fn base64_field(field: &str, text: &str) -> Result<Vec<u8>, SignatureError> {
    base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| malformed(format!("{field} is not base64: {e}")))
}

impl Bundle {
    /// Reads a signature file's bytes (at most `limit` of them).
    pub fn parse(bytes: &[u8], limit: u64) -> Result<Bundle, SignatureError> {
        if bytes.len() as u64 > limit {
            return Err(SignatureError::TooLarge { size: bytes.len() as u64, limit });
        }
        let json: BundleJson = serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
        if json.media_type != BUNDLE_MEDIA_TYPE {
            return Err(malformed(format!("media type {:?}, not {BUNDLE_MEDIA_TYPE:?}", json.media_type)));
        }
        let material = json.verification_material;
        let material = match (material.public_key, material.x509_certificate_chain, material.certificate) {
            (Some(key), None, None) => Material::PublicKey { hint: key.hint.filter(|h| !h.is_empty()) },
            (None, Some(chain), None) => {
                if chain.certificates.is_empty() || chain.certificates.len() > MAX_CHAIN {
                    let count = chain.certificates.len();
                    return Err(malformed(format!("a certificate chain of {count}, not 1 to {MAX_CHAIN}")));
                }
                let certificates = chain.certificates.iter().map(|c| base64_field("a certificate", &c.raw_bytes));
                Material::CertificateChain(certificates.collect::<Result<_, _>>()?)
            }
            (None, None, Some(_)) => {
                return Err(SignatureError::Unsupported(
                    "a Sigstore keyless bundle (a Fulcio certificate logged in Rekor): ztserve verifies key and \
                     certificate signatures, not yet Sigstore's keyless flow"
                        .into(),
                ));
            }
            _ => {
                return Err(malformed("verificationMaterial holds not exactly one of publicKey, x509CertificateChain"));
            }
        };
        if json.message_signature.is_some() {
            return Err(malformed("a messageSignature, where model_signing writes a dsseEnvelope"));
        }
        let envelope = json.dsse_envelope.ok_or_else(|| malformed("no dsseEnvelope"))?;
        if envelope.payload_type != PAYLOAD_TYPE {
            return Err(malformed(format!("payload type {:?}, not {PAYLOAD_TYPE:?}", envelope.payload_type)));
        }
        let [signature] = &envelope.signatures[..] else {
            let count = envelope.signatures.len();
            return Err(malformed(format!("{count} signatures in the envelope, where model_signing writes one")));
        };
        Ok(Bundle {
            material,
            payload: base64_field("the payload", &envelope.payload)?,
            signature: base64_field("the signature", &signature.sig)?,
        })
    }
}

/// The signature file of a statement `payload` signed with the public key whose PEM hashes to
/// `hint` (`signature`, over [`pae`] of the payload), as `model_signing` writes it.
pub fn write_bundle(hint: &str, payload: &[u8], signature: &[u8]) -> Vec<u8> {
    let base64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let bundle = serde_json::json!({
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": { "publicKey": { "hint": hint }, "tlogEntries": [] },
        "dsseEnvelope": {
            "payload": base64(payload),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{ "sig": base64(signature), "keyid": "" }],
        },
    });
    serde_json::to_vec(&bundle).expect("a bundle serializes")
}

/// The DSSE v1 pre-authentication encoding of `payload`, which the signature is over.
pub fn pae(payload: &[u8]) -> Vec<u8> {
    let mut encoded = format!("DSSEv1 {} {PAYLOAD_TYPE} {} ", PAYLOAD_TYPE.len(), payload.len()).into_bytes();
    encoded.extend_from_slice(payload);
    encoded
}

/// The encoding `model_signing` 0.2 signed instead (a bug its verifiers still accept): `DSSEV1`,
/// and the payload as Python writes a `bytes` value (`b'...'`, escaped).
pub fn pae_compat(payload: &[u8]) -> Vec<u8> {
    format!("DSSEV1 {} {PAYLOAD_TYPE} {} {}", PAYLOAD_TYPE.len(), payload.len(), python_bytes_repr(payload))
        .into_bytes()
}

/// `repr()` of a Python `bytes` value.
fn python_bytes_repr(bytes: &[u8]) -> String {
    let quote = if bytes.contains(&b'\'') && !bytes.contains(&b'"') { '"' } else { '\'' };
    let mut text = String::with_capacity(bytes.len() + 3);
    text.push('b');
    text.push(quote);
    for &b in bytes {
        match b {
            b'\\' => text.push_str("\\\\"),
            b'\t' => text.push_str("\\t"),
            b'\n' => text.push_str("\\n"),
            b'\r' => text.push_str("\\r"),
            _ if b as char == quote => {
                text.push('\\');
                text.push(quote);
            }
            0x20..0x7f => text.push(b as char),
            _ => text.push_str(&format!("\\x{b:02x}")),
        }
    }
    text.push(quote);
    text
}
