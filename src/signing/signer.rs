//! Signing as `model_signing sign key` signs: an in-toto statement of the files' SHA-256
//! digests, signed with an ECDSA key (P-256, P-384 or P-521, each with the hash `model_signing`
//! pairs with it) over its DSSE encoding, in a Sigstore bundle that names the key by the hint
//! verifiers match ([`super::Trust`]). For publishers of artifact bundles (compile caches).

use std::path::Path;

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{self, EcdsaKeyPair, EcdsaSigningAlgorithm, KeyPair as _};
use rustls::pki_types::PrivateKeyDer;
use rustls::pki_types::pem::PemObject as _;

use super::TrustError;
use crate::format::model_signature::{pae, write_bundle, write_statement};

/// A private key that signs, and the hint its signatures carry.
pub(crate) struct Signer {
    key: EcdsaKeyPair,
    hint: String,
}

impl Signer {
    /// The key of PEM file `path` (PKCS#8 or SEC1 `EC PRIVATE KEY`), on the first curve it is of.
    pub(crate) fn load(path: &Path) -> Result<Signer, TrustError> {
        let fail = |reason: String| TrustError { path: path.to_owned(), reason };
        let der =
            PrivateKeyDer::from_pem_file(path).map_err(|e| fail(format!("cannot read a PEM private key: {e}")))?;
        let curves: [&'static EcdsaSigningAlgorithm; 3] = [
            &signature::ECDSA_P256_SHA256_ASN1_SIGNING,
            &signature::ECDSA_P384_SHA384_ASN1_SIGNING,
            &signature::ECDSA_P521_SHA512_ASN1_SIGNING,
        ];
        let key = curves
            .iter()
            .find_map(|curve| EcdsaKeyPair::from_private_key_der(curve, der.secret_der()).ok())
            .ok_or_else(|| fail("not an ECDSA key on P-256, P-384 or P-521 (model_signing's key signers)".into()))?;
        let spki = aws_lc_rs::encoding::AsDer::<aws_lc_rs::encoding::PublicKeyX509Der>::as_der(key.public_key())
            .map_err(|_| fail("its public key cannot be encoded".into()))?;
        Ok(Signer { hint: super::trust::pem_hint(spki.as_ref()), key })
    }

    /// The signature file over `files` (each a path below directory `name` and its SHA-256).
    pub(crate) fn sign(&self, name: &str, files: &[(String, [u8; 32])]) -> Vec<u8> {
        let payload = write_statement(name, files);
        let signature = self.key.sign(&SystemRandom::new(), &pae(&payload)).expect("ECDSA signing does not fail");
        write_bundle(&self.hint, &payload, signature.as_ref())
    }
}
