//! Checking what landed: a unit's bytes in the partial file against its digest (decoded first
//! where the digest covers decoded bytes), and legacy big-endian blobs decoded after download.

use std::os::unix::fs::FileExt;

use super::layout::Unit;
use crate::format;
use crate::format::decode::{Hasher, decode_component, verify_digest};

/// Decodes a legacy big-endian blob to little-endian after checking its stored digest.
pub(super) fn decode_blob(object: &str, component: &format::Component, stored: &[u8]) -> anyhow::Result<Vec<u8>> {
    verify_digest(object, component, stored)?;
    Ok(decode_component(object, component, stored)?.into_owned())
}

/// Whether a unit's bytes in the partial file match its digest (true when it has none).
pub(super) fn check_unit(partial: &std::fs::File, unit: &Unit) -> anyhow::Result<bool> {
    // A decoded unit's stored digest was checked before decoding (`decode_blob`).
    let Some(digest) = unit.digest.clone().filter(|_| unit.transform.is_none()) else { return Ok(true) };
    if let Some((object, component)) = &unit.decoded_check {
        // The digest covers the decoded bytes of the stored stream just written.
        let mut stored = vec![0u8; (unit.output.end - unit.output.start) as usize];
        partial.read_exact_at(&mut stored, unit.output.start)?;
        let verdict =
            decode_component(object, component, &stored).and_then(|decoded| verify_digest(object, component, &decoded));
        return Ok(verdict.is_ok());
    }
    let mut hasher = Hasher::for_digest(&digest);
    let mut buffer = vec![0u8; 1 << 20];
    let mut at = unit.output.start;
    while at < unit.output.end {
        let n = (unit.output.end - at).min(buffer.len() as u64) as usize;
        partial.read_exact_at(&mut buffer[..n], at)?;
        hasher.update(&buffer[..n]);
        at += n as u64;
    }
    Ok(hasher.finish().as_ref() == Some(&digest))
}
