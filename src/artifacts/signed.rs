//! A bundle's signature checked against what is trusted, before any of its bytes are used:
//! the publisher's `model_signing` signature must verify, its statement must be signed for the
//! bundle's whole name (its subject's name: a bundle copied to another name is refused) and
//! sign exactly the bundle's paths, each with the SHA-256 the bundle names (so each blob,
//! checked against its digest as it is read, is a signed byte). The server checks it on publish with
//! `[artifacts] require_signature`; `ztserve artifacts restore` before it fetches a blob.

use super::{ArtifactError, Bundle};
use crate::signing::Trust;

/// The signer of `bundle`, published as `name`, when its signature verifies with `trust` over
/// exactly its files (a signature file of at most `limit` bytes).
pub(crate) fn verify_bundle(trust: &Trust, name: &str, bundle: &Bundle, limit: u64) -> Result<String, ArtifactError> {
    let refused = |refused| ArtifactError::Signature { name: name.to_owned(), refused };
    let Some(signature) = &bundle.signature else {
        return Err(ArtifactError::Unsigned(name.to_owned()));
    };
    let bytes = serde_json::to_vec(signature).expect("a JSON value serializes");
    let signed = trust.verify(&bytes, limit).map_err(refused)?;
    signed.match_name(name).map_err(refused)?;
    signed.match_names(bundle.files.iter().map(|file| file.path.as_str())).map_err(refused)?;
    for file in &bundle.files {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(&file.sha256, &mut digest).map_err(|_| ArtifactError::BadDigest(file.sha256.clone()))?;
        signed.check_digest(&file.path, &digest).map_err(refused)?;
    }
    Ok(signed.signer)
}

/// The bundle of `files` (each a path below the bundle's directory and its blob) signed by
/// `signer` for bundle name `name`.
pub(crate) fn sign_bundle(signer: &crate::signing::Signer, name: &str, files: Vec<super::BundleFile>) -> Bundle {
    let digests: Vec<(String, [u8; 32])> = files
        .iter()
        .map(|file| {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(&file.sha256, &mut digest).expect("a bundle file's digest is hex");
            (file.path.clone(), digest)
        })
        .collect();
    let signature = signer.sign(name, &digests);
    Bundle { files, signature: Some(serde_json::from_slice(&signature).expect("the signature file is JSON")) }
}
