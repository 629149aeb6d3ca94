//! Refit deltas: the elements of one region (a rank's byte range of a tensor) that differ
//! between two versions, as exact replacements (indices and new bytes, never arithmetic, so
//! bf16 and fp8 stay bit-exact), and the rules a receiver checks before it trusts one.
//!
//! Wire format, version 1 (all integers little-endian). A fixed 48-byte header:
//!
//! | bytes  | field        | meaning                                                            |
//! |--------|--------------|--------------------------------------------------------------------|
//! | 0..8   | magic        | `ZTDELTA1`                                                         |
//! | 8      | kind         | 0 = patch, 1 = whole                                               |
//! | 9      | width        | element width in bytes: 1, 2, 4 or 8                               |
//! | 10..16 | reserved     | six zero bytes                                                     |
//! | 16..24 | elements     | u64, region length / width                                         |
//! | 24..32 | changed      | u64, elements that differ (whole: = elements)                      |
//! | 32..40 | payload_len  | u64, bytes after the header (exactly)                              |
//! | 40..48 | new_xxh3     | u64, XXH3-64 (seed 0) of the region's new bytes                    |
//!
//! A *whole* payload is the region's new bytes as they are (`payload_len = elements * width`).
//! A *patch* with `changed = 0` has no payload; otherwise its payload is exactly one zstd frame
//! that declares its content size and holds `gaps ‖ planes`: `changed` LEB128 varints (7 bits
//! a byte, low group first, high bit set on all but the last byte, shortest form), the first
//! the first changed index and each next `index_i - index_{i-1} - 1`; then the new values
//! with their bytes in planes: byte 0 of every changed element in index order, then byte 1,
//! and so on (`changed * width` bytes; the exponent bytes of bf16/fp32 cluster and compress
//! better that way). A patch changes at most half the elements (`changed <= elements / 2`):
//! [`encode`] sends a region whole when more changed, or when the patch would not be under
//! half the region, because a patch that saves less than 2x is not worth its scatter.
//! The digest lets a client that holds the *old* region check the result: a stale or
//! corrupt base shows as a mismatch, so [`apply`] verifies it and leaves the target as it was
//! on every error. XXH3 rather than SHA-256: it guards against accident, not an adversary
//! (the transport does that), at memory speed.

use crate::error::{FormatError, Result};
use xxhash_rust::xxh3::xxh3_64;

/// The first eight bytes of every delta.
pub const MAGIC: &[u8; 8] = b"ZTDELTA1";
/// The fixed header's length; the payload follows it.
pub const HEADER_LEN: usize = 48;
const KIND_PATCH: u8 = 0;
const KIND_WHOLE: u8 = 1;
/// The longest LEB128 encoding of a u64.
const MAX_VARINT_LEN: u64 = 10;

/// How a delta carries the region's new bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Changed indices and their new values.
    Patch,
    /// The whole region's new bytes.
    Whole,
}

/// A delta's fixed header, checked for internal consistency by [`parse_header`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    /// Element width in bytes.
    pub width: usize,
    pub elements: u64,
    pub changed: u64,
    pub payload_len: u64,
    /// XXH3-64 of the region's new bytes.
    pub new_xxh3: u64,
}

/// What [`apply`] did to the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub kind: Kind,
    /// Elements written.
    pub changed: u64,
    pub elements: u64,
}

fn fault(code: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::Delta { code, detail: detail.into() }
}

fn check_width(width: usize) -> Result<()> {
    match width {
        1 | 2 | 4 | 8 => Ok(()),
        _ => Err(fault("delta_bad_width", format!("element width {width} is not 1, 2, 4 or 8"))),
    }
}

/// The delta that turns `old` into `new`, regions of `width`-byte elements, its patch
/// compressed at zstd `level`: a patch when it is under half the region, else the region whole.
pub fn encode(old: &[u8], new: &[u8], width: usize, level: i32) -> Result<Vec<u8>> {
    check_width(width)?;
    if old.len() != new.len() {
        return Err(fault(
            "delta_input",
            format!("old region is {} bytes, new region {}: they must be the same length", old.len(), new.len()),
        ));
    }
    if new.len() % width != 0 {
        return Err(fault("delta_input", format!("region of {} bytes is not whole {width}-byte elements", new.len())));
    }
    let elements = (new.len() / width) as u64;
    let header =
        |kind, changed, payload_len| Header { kind, width, elements, changed, payload_len, new_xxh3: xxh3_64(new) };
    let whole = || {
        let mut out = write_header(&header(Kind::Whole, elements, new.len() as u64));
        out.extend_from_slice(new);
        Ok(out)
    };
    let Some(changes) = Changes::collect(old, new, width, elements / 2) else { return whole() };
    if changes.count == 0 {
        return Ok(write_header(&header(Kind::Patch, 0, 0)));
    }
    let mut body = changes.gaps;
    body.reserve(changes.rows.len());
    for plane in 0..width {
        body.extend(changes.rows.iter().skip(plane).step_by(width));
    }
    let frame = zstd::bulk::compress(&body, level).map_err(|e| fault("delta_zstd", format!("compressing: {e}")))?;
    if HEADER_LEN + frame.len() >= new.len() / 2 {
        return whole();
    }
    let mut out = write_header(&header(Kind::Patch, changes.count, frame.len() as u64));
    out.extend_from_slice(&frame);
    Ok(out)
}

/// The delta that carries `new` whole, regions of `width`-byte elements: what a sender sends
/// when the receiver's old region cannot be the base (another dtype, shape or length, or none).
pub fn whole(new: &[u8], width: usize) -> Result<Vec<u8>> {
    check_width(width)?;
    if new.len() % width != 0 {
        return Err(fault("delta_input", format!("region of {} bytes is not whole {width}-byte elements", new.len())));
    }
    let elements = (new.len() / width) as u64;
    let header = Header {
        kind: Kind::Whole,
        width,
        elements,
        changed: elements,
        payload_len: new.len() as u64,
        new_xxh3: xxh3_64(new),
    };
    let mut out = write_header(&header);
    out.extend_from_slice(new);
    Ok(out)
}

/// The changed elements of a region, as the patch payload lists them before compression.
struct Changes {
    count: u64,
    gaps: Vec<u8>,
    /// New values, element after element (transposed into planes later).
    rows: Vec<u8>,
}

impl Changes {
    /// `None` when more than `limit` elements changed.
    fn collect(old: &[u8], new: &[u8], width: usize, limit: u64) -> Option<Changes> {
        let mut changes = Changes { count: 0, gaps: Vec::new(), rows: Vec::new() };
        let mut next = 0u64; // the index after the last changed one
        let mut record = |index: u64, value: &[u8]| {
            push_varint(&mut changes.gaps, index - next);
            changes.rows.extend_from_slice(value);
            next = index + 1;
            changes.count += 1;
            changes.count <= limit
        };
        // Equal 8-byte words are the common case: one compare skips them. Widths divide 8, so
        // words hold whole elements and the tail starts on an element boundary.
        let per_word = 8 / width;
        let element_mask = if width == 8 { u64::MAX } else { (1u64 << (width * 8)) - 1 };
        let (old_words, new_words) = (old.chunks_exact(8), new.chunks_exact(8));
        let (old_tail, new_tail) = (old_words.remainder(), new_words.remainder());
        for (word_index, (a, b)) in old_words.zip(new_words).enumerate() {
            let diff = u64::from_le_bytes(a.try_into().unwrap()) ^ u64::from_le_bytes(b.try_into().unwrap());
            if diff == 0 {
                continue;
            }
            for slot in 0..per_word {
                if (diff >> (slot * width * 8)) & element_mask != 0 {
                    let index = (word_index * per_word + slot) as u64;
                    if !record(index, &b[slot * width..(slot + 1) * width]) {
                        return None;
                    }
                }
            }
        }
        let tail_start = (old.len() - old_tail.len()) / width;
        for (slot, (a, b)) in old_tail.chunks_exact(width).zip(new_tail.chunks_exact(width)).enumerate() {
            if a != b && !record((tail_start + slot) as u64, b) {
                return None;
            }
        }
        Some(changes)
    }
}

fn push_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn write_header(header: &Header) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + header.payload_len as usize);
    out.extend_from_slice(MAGIC);
    out.push(match header.kind {
        Kind::Patch => KIND_PATCH,
        Kind::Whole => KIND_WHOLE,
    });
    out.push(header.width as u8);
    out.extend_from_slice(&[0; 6]);
    for field in [header.elements, header.changed, header.payload_len, header.new_xxh3] {
        out.extend_from_slice(&field.to_le_bytes());
    }
    out
}

/// The header of `delta`, checked against itself and against the delta's length.
pub fn parse_header(delta: &[u8]) -> Result<Header> {
    if delta.len() < HEADER_LEN {
        return Err(fault(
            "delta_truncated",
            format!("{} bytes, shorter than the {HEADER_LEN}-byte header", delta.len()),
        ));
    }
    if &delta[..8] != MAGIC {
        return Err(fault("delta_bad_magic", format!("magic {:?} is not \"ZTDELTA1\"", crate::printable(&delta[..8]))));
    }
    let kind = match delta[8] {
        KIND_PATCH => Kind::Patch,
        KIND_WHOLE => Kind::Whole,
        other => return Err(fault("delta_bad_kind", format!("kind {other} is not 0 (patch) or 1 (whole)"))),
    };
    let width = delta[9] as usize;
    check_width(width)?;
    if delta[10..16] != [0; 6] {
        return Err(fault("delta_bad_header", "reserved header bytes 10..16 are not zero"));
    }
    let field = |at: usize| u64::from_le_bytes(delta[at..at + 8].try_into().unwrap());
    let header =
        Header { kind, width, elements: field(16), changed: field(24), payload_len: field(32), new_xxh3: field(40) };
    let (elements, changed, payload_len) = (header.elements, header.changed, header.payload_len);
    let region = elements
        .checked_mul(width as u64)
        .ok_or_else(|| fault("delta_counts", format!("{elements} elements of {width} bytes overflow 64 bits")))?;
    let counts_ok = match kind {
        Kind::Whole => changed == elements && payload_len == region,
        Kind::Patch => changed <= elements / 2 && (changed == 0) == (payload_len == 0),
    };
    if !counts_ok {
        return Err(fault(
            "delta_counts",
            format!(
                "{kind:?} of {elements} elements says {changed} changed in a {payload_len}-byte payload: a whole \
                 region changes every element and carries elements * width bytes; a patch changes at most half \
                 of them and has a payload exactly when it changes any"
            ),
        ));
    }
    let actual = (delta.len() - HEADER_LEN) as u64;
    if actual != payload_len {
        let code = if actual < payload_len { "delta_truncated" } else { "delta_trailing_bytes" };
        return Err(fault(code, format!("the header declares a {payload_len}-byte payload, {actual} bytes follow it")));
    }
    Ok(header)
}

/// Applies `delta` to `target`, the region's old bytes, which become its new bytes. Every
/// check (header, sizes, the zstd frame, indices, the new bytes' digest) passes before the
/// call returns `Ok`; on any error `target` holds exactly what it held before (a patch whose
/// digest fails is undone), so a caller can retry or fetch the region whole.
pub fn apply(delta: &[u8], target: &mut [u8]) -> Result<Applied> {
    let header = parse_header(delta)?;
    let (width, elements, changed) = (header.width, header.elements, header.changed);
    if elements.checked_mul(width as u64) != Some(target.len() as u64) {
        return Err(fault(
            "delta_region_mismatch",
            format!("delta is for {elements} elements of {width} bytes, the target is {} bytes", target.len()),
        ));
    }
    let payload = &delta[HEADER_LEN..];
    let applied = Applied { kind: header.kind, changed, elements };
    let digest_mismatch = |actual: u64| {
        fault(
            "delta_digest_mismatch",
            format!(
                "the new region should hash to xxh3 {:016x}, it hashes to {actual:016x}: the old region is not the \
                 one this delta was made from, or the delta is corrupt (the target is left as it was)",
                header.new_xxh3
            ),
        )
    };
    if header.kind == Kind::Whole {
        let actual = xxh3_64(payload);
        if actual != header.new_xxh3 {
            return Err(digest_mismatch(actual));
        }
        target.copy_from_slice(payload);
        return Ok(applied);
    }
    if changed == 0 {
        let actual = xxh3_64(target);
        return if actual == header.new_xxh3 { Ok(applied) } else { Err(digest_mismatch(actual)) };
    }
    let body = decompress_body(payload, changed, elements, width)?;
    let values_len = (changed as usize) * width;
    let (gaps, planes) = body.split_at(body.len() - values_len);
    for_each_index(gaps, changed, elements, |_, _| {})?;
    // Checked above: from here on nothing can fail but the digest, and that is undone.
    let mut saved = Vec::with_capacity(values_len);
    let count = changed as usize;
    for_each_index(gaps, changed, elements, |k, index| {
        let element = &mut target[index as usize * width..][..width];
        saved.extend_from_slice(element);
        for (plane, byte) in element.iter_mut().enumerate() {
            *byte = planes[plane * count + k];
        }
    })?;
    let actual = xxh3_64(target);
    if actual != header.new_xxh3 {
        for_each_index(gaps, changed, elements, |k, index| {
            target[index as usize * width..][..width].copy_from_slice(&saved[k * width..][..width]);
        })?;
        return Err(digest_mismatch(actual));
    }
    Ok(applied)
}

/// The patch payload inflated: exactly one zstd frame, declaring a content size no larger than
/// `changed` longest varints and values (so never more than the target's size implies), that
/// inflates to exactly that size.
fn decompress_body(payload: &[u8], changed: u64, elements: u64, width: usize) -> Result<Vec<u8>> {
    let zstd = |detail: String| fault("delta_zstd", detail);
    let frame_len = zstd::zstd_safe::find_frame_compressed_size(payload)
        .map_err(|code| zstd(format!("payload is not a zstd frame: {}", zstd::zstd_safe::get_error_name(code))))?;
    if frame_len != payload.len() {
        return Err(zstd(format!("payload holds {} bytes after its zstd frame", payload.len() - frame_len)));
    }
    let declared = match zstd::zstd_safe::get_frame_content_size(payload) {
        Ok(Some(size)) => size,
        _ => return Err(zstd("the zstd frame does not declare its content size".into())),
    };
    let max_gap_len = (64 - (elements - 1).leading_zeros() as u64).div_ceil(7).clamp(1, MAX_VARINT_LEN);
    let width = width as u64;
    // Saturating: only a region near 2^64 bytes could overflow, and it cannot be in memory.
    let (least, most) = (changed.saturating_mul(1 + width), changed.saturating_mul(max_gap_len + width));
    if declared < least || declared > most {
        return Err(zstd(format!(
            "the zstd frame declares {declared} bytes; {changed} changed elements of {width} bytes need {least} to {most}"
        )));
    }
    let declared = declared as usize;
    let mut body = Vec::with_capacity(declared);
    match zstd::bulk::Decompressor::new().and_then(|mut d| d.decompress_to_buffer(payload, &mut body)) {
        Ok(n) if n == declared => Ok(body),
        Ok(n) => Err(zstd(format!("the zstd frame inflates to {n} bytes, it declares {declared}"))),
        Err(e) => Err(zstd(format!("the zstd frame is corrupt or inflates past its declared {declared} bytes: {e}"))),
    }
}

/// Calls `each(k, index)` for the `changed` indices the gaps encode, after checking each: a
/// shortest-form varint, the index below `elements`; and that the gaps hold nothing more.
fn for_each_index(gaps: &[u8], changed: u64, elements: u64, mut each: impl FnMut(usize, u64)) -> Result<()> {
    let bad = |detail: String| fault("delta_indices", detail);
    let mut at = 0usize;
    let mut next = 0u64;
    for k in 0..changed as usize {
        let start = at;
        let mut gap = 0u64;
        loop {
            let Some(&byte) = gaps.get(at) else {
                return Err(bad(format!("the gaps end inside index {k} of {changed}")));
            };
            let shift = 7 * (at - start) as u32;
            at += 1;
            let group = (byte & 0x7f) as u64;
            if shift > 63 || (shift == 63 && group > 1) {
                return Err(bad(format!("index {k}'s gap is longer than a u64")));
            }
            gap |= group << shift;
            if byte & 0x80 == 0 {
                if byte == 0 && at - start > 1 {
                    return Err(bad(format!("index {k}'s gap is not in its shortest form")));
                }
                break;
            }
        }
        let index = next.checked_add(gap).filter(|&index| index < elements).ok_or_else(|| {
            bad(format!(
                "index {k} of {changed} (the one after {next} skipped by {gap}) is past the {elements} elements"
            ))
        })?;
        each(k, index);
        next = index + 1;
    }
    if at != gaps.len() {
        return Err(bad(format!("{} bytes follow the {changed} gaps", gaps.len() - at)));
    }
    Ok(())
}

#[cfg(test)]
#[path = "delta_tests.rs"]
mod tests;
