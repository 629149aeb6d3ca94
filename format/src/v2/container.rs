//! The v2 container frame (L0): the footer at the end of a file (where the manifest is, its
//! length and XXH3-64, the version) read and written, the manifest hash checked, and a whole
//! file laid out around a blob heap and a manifest.

use std::ops::Range;

use crate::{FormatError, Limits, Result, V2_MAGIC};

/// Bytes of the footer: manifest offset, length and hash, version, reserved, magic.
pub use crate::container::V2_FOOTER_LEN as FOOTER_LEN;
/// Every blob (and the manifest) starts at a multiple of this, and never before it.
pub const BLOB_ALIGNMENT: u64 = 4096;
/// The footer version this reader understands.
pub const VERSION: u32 = 2;

/// The footer at the end of a v2 file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footer {
    pub manifest_offset: u64,
    pub manifest_length: u64,
    pub manifest_hash: u64,
    pub version: u32,
}

impl Footer {
    /// Reads the footer from the last [`FOOTER_LEN`] bytes of `tail` (of a file of `file_len`
    /// bytes), checking the file's size, the footer magic and the version.
    pub fn read(file_len: u64, tail: &[u8]) -> Result<Footer> {
        let min = crate::HEADER_LEN + FOOTER_LEN;
        if file_len < min {
            return Err(FormatError::Truncated { len: file_len, min });
        }
        let start = tail
            .len()
            .checked_sub(FOOTER_LEN as usize)
            .ok_or(FormatError::Truncated { len: tail.len() as u64, min: FOOTER_LEN })?;
        let footer = &tail[start..];
        if &footer[32..40] != V2_MAGIC {
            return Err(FormatError::BadFooterMagic { found: crate::printable(&footer[32..40]) });
        }
        let u64_at = |at: usize| u64::from_le_bytes(footer[at..at + 8].try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(footer[24..28].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(FormatError::UnsupportedContainerVersion { version });
        }
        Ok(Footer { manifest_offset: u64_at(0), manifest_length: u64_at(8), manifest_hash: u64_at(16), version })
    }

    /// Where the manifest is, checked against the file and the size limit before any of it is
    /// read. A data shard (no manifest) is [`FormatError::DataShard`]: its blobs belong to the
    /// model of a root file.
    pub fn manifest_span(&self, file_len: u64, limits: &Limits) -> Result<Range<u64>> {
        let (offset, length) = (self.manifest_offset, self.manifest_length);
        if length == 0 {
            if offset != 0 || self.manifest_hash != 0 {
                return Err(FormatError::DataShardFooter { offset, hash: self.manifest_hash });
            }
            return Err(FormatError::DataShard);
        }
        if length > limits.max_manifest_bytes {
            return Err(FormatError::ManifestTooLarge { size: length, limit: limits.max_manifest_bytes });
        }
        if offset % BLOB_ALIGNMENT != 0 || offset < BLOB_ALIGNMENT {
            return Err(FormatError::ManifestMisaligned { offset });
        }
        let data_end = file_len - FOOTER_LEN;
        match offset.checked_add(length) {
            Some(end) if end <= data_end => Ok(offset..end),
            _ => Err(FormatError::ManifestOutOfBounds { offset, length, data_end }),
        }
    }
}

/// Checks the manifest bytes against the footer's XXH3-64 hash; nothing is parsed before.
pub fn check_manifest_hash(bytes: &[u8], expected: u64) -> Result<()> {
    let actual = xxhash_rust::xxh3::xxh3_64(bytes);
    if actual != expected {
        return Err(FormatError::ManifestHashMismatch { expected, actual });
    }
    Ok(())
}

/// The container (L0) around a blob heap and a manifest: the magic, zero padding to 4096,
/// `heap` (which so starts at offset 4096), zero padding to the next multiple of 4096, the
/// manifest, and the footer with its offset, length and XXH3-64. An empty manifest makes a
/// data shard (offset, length and hash zero). Blob offsets in the manifest are the writer's
/// business; tests and the fuzzer build files by hand with this.
pub fn file_around(heap: &[u8], manifest: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(2 * BLOB_ALIGNMENT as usize + heap.len() + manifest.len() + 40);
    file.extend_from_slice(V2_MAGIC);
    file.resize(BLOB_ALIGNMENT as usize, 0);
    file.extend_from_slice(heap);
    file.resize(file.len().next_multiple_of(BLOB_ALIGNMENT as usize), 0);
    let offset = file.len() as u64;
    file.extend_from_slice(manifest);
    file.extend_from_slice(&footer(offset, manifest));
    file
}

/// The footer of a file whose manifest `manifest` starts at `offset` (a data shard's, all
/// zero but version and magic, when `manifest` is empty).
pub(super) fn footer(offset: u64, manifest: &[u8]) -> [u8; FOOTER_LEN as usize] {
    let (offset, hash) = if manifest.is_empty() { (0, 0) } else { (offset, xxhash_rust::xxh3::xxh3_64(manifest)) };
    let mut footer = [0u8; FOOTER_LEN as usize];
    footer[..8].copy_from_slice(&offset.to_le_bytes());
    footer[8..16].copy_from_slice(&(manifest.len() as u64).to_le_bytes());
    footer[16..24].copy_from_slice(&hash.to_le_bytes());
    footer[24..28].copy_from_slice(&VERSION.to_le_bytes());
    footer[32..].copy_from_slice(V2_MAGIC);
    footer
}
