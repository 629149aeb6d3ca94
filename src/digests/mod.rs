//! Content digests, as a component: the SHA-256 of each file a model version publishes (the
//! Hub API's ETags and LFS oids, the OCI registry's digests, the S3 endpoint's checksums) and
//! of each file's image layer. It owns where digests are kept ([`store`]: in memory and in the
//! digest store, by file identity, and the digests a `SHA256SUMS` states until checked), the
//! queue of those to compute ([`queue`]: urgency, sharing between askers, retries, the
//! reconciliation after a rescan, progress) and how long they take ([`throughput`]). It knows
//! nothing of models, sources or requests: the service decides which files to hash and hashes
//! them (`service::hashing`).

pub(crate) mod queue;
pub(crate) mod store;
mod throughput;

pub(crate) use self::queue::{DigestProgress, ModelFiles, Queue, QueuedJob, Urgency};
pub(crate) use self::store::{DigestStoreError, FileDigests, FileIdentity, file_identity};
pub(crate) use self::throughput::Throughput;

/// Whether `hex` is a SHA-256 as digests are written: 64 lowercase hexadecimal digits.
pub(crate) fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The hex of a digest named `sha256:HEX` (an OCI digest, an artifact blob's name), if
/// `digest` is one.
pub(crate) fn sha256_hex(digest: &str) -> Option<&str> {
    digest.strip_prefix("sha256:").filter(|hex| is_sha256_hex(hex))
}
