//! The trailer of the 0.1 and 1.x containers, which locates their manifest: a little-endian
//! u64 manifest size at the end of the file, followed in 1.x by the `ZTEN1000` footer magic.

use std::ops::Range;

use crate::container::printable;
use crate::{Container, FormatError, HEADER_LEN, Limits, Result, V1_MAGIC};

/// Finds the manifest of a 0.1 or 1.x file of `file_len` bytes from its last bytes, `tail`
/// (at least the trailer, or the whole file when shorter): checks the footer magic, the size
/// field and the size limit.
pub(crate) fn manifest_span(container: Container, file_len: u64, tail: &[u8], limits: &Limits) -> Result<Range<u64>> {
    if file_len < container.min_file_len() {
        return Err(FormatError::Truncated { len: file_len, min: container.min_file_len() });
    }
    let trailer_len = container.trailer_len() as usize;
    let trailer = tail
        .len()
        .checked_sub(trailer_len)
        .map(|start| &tail[start..])
        .ok_or(FormatError::Truncated { len: tail.len() as u64, min: trailer_len as u64 })?;
    if container == Container::V1 && &trailer[8..16] != V1_MAGIC {
        return Err(FormatError::BadFooterMagic { found: printable(&trailer[8..16]) });
    }
    let size = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
    if size == 0 {
        return Err(FormatError::ManifestEmpty);
    }
    if size > limits.max_manifest_bytes {
        return Err(FormatError::ManifestTooLarge { size, limit: limits.max_manifest_bytes });
    }
    let available = file_len - HEADER_LEN - trailer_len as u64;
    if size > available {
        return Err(FormatError::ManifestBeyondFile { size, available });
    }
    let end = file_len - trailer_len as u64;
    Ok(end - size..end)
}
