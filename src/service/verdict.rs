//! What a signature check concludes for one model version, as the service keeps it with what
//! it has learnt of the version: the verdict, and the signature file's check that every asker
//! of the version shares.

use std::sync::Arc;
use std::time::SystemTime;

use crate::signing::{SignatureError, SignedModel};

/// What a model version's signature was found to say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SignatureState {
    /// No signature file covers it.
    Unsigned,
    /// Its signature verifies, and every file of its signed directory matches.
    Verified {
        signer: String,
        files: usize,
    },
    Failed(SignatureError),
}

/// A verdict, with when it was reached and for which version of the signed directory.
#[derive(Debug)]
pub(crate) struct SignatureVerdict {
    pub(crate) state: SignatureState,
    pub(crate) checked_at: SystemTime,
    /// The signed directory's version it holds for (empty for an unsigned model).
    pub(super) directory_version: String,
}

/// A signature file's check (its signer and statement), once per version of its directory: a
/// statement of 100k files is tens of MB of JSON, read once however many ask.
pub(crate) type StatementCheck = tokio::sync::OnceCell<Result<Arc<SignedModel>, SignatureError>>;
