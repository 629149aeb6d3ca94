//! OpenSSF model signatures, as `model_signing` 1.x (sigstore/model-transparency) writes them:
//! the signature file and its statement are read by `format::model_signature` (pure bytes);
//! here its signature is checked against what is trusted, public keys and certificates chained
//! to configured CAs ([`trust`]); and bundles of files are signed the same way with a key
//! ([`signer`], for artifact publishers). It knows nothing of models, sources or requests:
//! whoever asks gives the bytes and the digests.

mod signer;
mod trust;

pub(crate) use crate::format::model_signature::{SignatureError, SignedModel};
pub(crate) use signer::Signer;
pub(crate) use trust::{Trust, TrustError};

#[cfg(test)]
mod tests;
