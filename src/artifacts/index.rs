//! What the artifact store holds, in memory: each bundle's blobs and when it was last read,
//! each blob's size and how many bundles name it, and the bytes counted against the bound,
//! with the reservation an upload in progress counts its bytes by.

use std::collections::HashMap;
use std::time::SystemTime;

use super::ArtifactStore;
use super::bundle::Bundle;
use super::error::ArtifactError;

/// What the store holds, in memory: rebuilt from the directory at start.
#[derive(Default)]
pub(super) struct Index {
    pub(super) bundles: HashMap<String, HeldBundle>,
    pub(super) blobs: HashMap<String, HeldBlob>,
    /// Bytes of the blobs and bundle documents held, and of the files being written.
    pub(super) bytes: u64,
}

pub(super) struct HeldBundle {
    pub(super) blobs: Vec<String>,
    /// The bundle document's own bytes.
    pub(super) len: u64,
    pub(super) last_read: SystemTime,
}

pub(super) struct HeldBlob {
    pub(super) len: u64,
    /// How many bundles name it.
    pub(super) named_by: usize,
    pub(super) written: SystemTime,
}

/// Bytes of a file being written, counted against the bound (in steps of [`RESERVE_STEP`]
/// while the bound is far, so an upload's pieces seldom take the index's lock); given back
/// when dropped, unless the file was kept (then the bytes written are the held file's).
pub(super) struct Reservation<'a> {
    store: &'a ArtifactStore,
    /// Bytes counted in the index for this file.
    counted: u64,
    /// Bytes written to it.
    pub(super) used: u64,
}

/// How far ahead of its bytes an upload counts them, while that fits under the bound.
const RESERVE_STEP: u64 = 8 << 20;

impl Reservation<'_> {
    pub(super) fn new(store: &ArtifactStore) -> Reservation<'_> {
        Reservation { store, counted: 0, used: 0 }
    }

    /// Counts `more` bytes, making room for them when the bound is reached.
    pub(super) fn grow(&mut self, more: u64) -> Result<(), ArtifactError> {
        let needed = (self.used + more).saturating_sub(self.counted);
        if needed > 0 {
            let step = needed.max(RESERVE_STEP);
            // A whole step only where it fits as things stand: never evict for bytes ahead.
            let counted = (step > needed && self.store.count_if_fits(step)).then_some(step);
            self.counted += match counted {
                Some(step) => step,
                None => {
                    self.store.reserve(needed)?;
                    needed
                }
            };
        }
        self.used += more;
        Ok(())
    }

    /// The bytes written now count as the file kept in `index`; those counted ahead go back.
    pub(super) fn keep(mut self, index: &mut Index) {
        index.bytes -= self.counted - self.used;
        self.counted = 0;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.counted > 0 {
            self.store.index().bytes -= self.counted;
        }
    }
}

impl Index {
    /// Refused when `name` is taken or a blob `bundle` names is not held with its size.
    pub(super) fn check_publishable(&self, name: &str, bundle: &Bundle) -> Result<(), ArtifactError> {
        if self.bundles.contains_key(name) {
            return Err(ArtifactError::Exists(name.to_owned()));
        }
        match bundle.files.iter().find(|file| self.blobs.get(&file.sha256).is_none_or(|blob| blob.len != file.size)) {
            Some(file) => Err(ArtifactError::MissingBlob { name: name.to_owned(), digest: file.sha256.clone() }),
            None => Ok(()),
        }
    }

    /// Enters bundle `name`, its document `len` bytes (counted by the caller).
    pub(super) fn name(&mut self, name: String, bundle: &Bundle, len: u64, last_read: SystemTime) {
        let mut blobs: Vec<String> = bundle.files.iter().map(|f| f.sha256.clone()).collect();
        blobs.sort();
        blobs.dedup();
        for hex in &blobs {
            self.blobs.get_mut(hex).expect("checked held").named_by += 1;
        }
        self.bundles.insert(name, HeldBundle { blobs, len, last_read });
    }

    /// Drops bundle `name`'s entry and its document's bytes: the blobs no other bundle names.
    pub(super) fn forget_bundle(&mut self, name: &str) -> Vec<String> {
        let Some(held) = self.bundles.remove(name) else { return Vec::new() };
        self.bytes -= held.len;
        held.blobs
            .into_iter()
            .filter(|hex| {
                // Every held bundle's blobs are held; were one not, it is nothing to remove.
                let Some(blob) = self.blobs.get_mut(hex) else { return false };
                blob.named_by = blob.named_by.saturating_sub(1);
                blob.named_by == 0
            })
            .collect()
    }
}
