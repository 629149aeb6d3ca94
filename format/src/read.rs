//! Finding and parsing a file's manifest: the [`ManifestReads`] a reader makes (the header and
//! the tail, then at most one more), the [`Located`] manifest they find, and [`parse_file`] over a
//! whole file in memory.

use std::ops::Range;

use crate::{Container, HEADER_LEN, Limits, Manifest, Result, cbor, v2, zt1};

/// Finds the manifest from the file length and the file's last bytes (at least the trailer, or
/// the whole file when shorter). Checks the footer, the size field and the size limit. Returns
/// the manifest hash v2 declares.
fn manifest_span(
    container: Container,
    file_len: u64,
    tail: &[u8],
    limits: &Limits,
) -> Result<(Range<u64>, Option<u64>)> {
    if container == Container::V2 {
        let footer = v2::Footer::read(file_len, tail)?;
        return Ok((footer.manifest_span(file_len, limits)?, Some(footer.manifest_hash)));
    }
    Ok((zt1::manifest_span(container, file_len, tail, limits)?, None))
}

/// Decodes and structurally validates a manifest found at `span` in a file of `file_len` bytes.
fn parse_manifest(
    container: Container,
    bytes: &[u8],
    span: Range<u64>,
    file_len: u64,
    limits: &Limits,
) -> Result<Manifest> {
    if container == Container::V2 {
        let strict = Limits { max_cbor_depth: limits.max_cbor_depth.min(v2::MAX_DEPTH), ..*limits };
        let value = cbor::decode(bytes, &strict, cbor::Rules::DETERMINISTIC)?;
        return v2::parse(value, span, file_len, limits);
    }
    zt1::parse(container, bytes, span, file_len, limits)
}

/// Parses and validates a whole file held in memory (or mapped).
pub fn parse_file(file: &[u8], limits: &Limits) -> Result<Manifest> {
    let reads = ManifestReads::new(file.len() as u64, MAX_TRAILER_LEN);
    let slice = |range: Range<u64>| &file[range.start as usize..range.end as usize];
    let (head, tail) = (slice(reads.head()), slice(reads.tail()));
    let located = reads.locate(head, tail, limits)?;
    located.parse(tail, slice(located.missing.clone()), limits)
}

/// The longest trailer of any container: a tail this long always holds the manifest's place.
pub const MAX_TRAILER_LEN: u64 = v2::FOOTER_LEN;

/// The reads that find and parse a file's manifest, whoever makes them (a local `pread`, an
/// S3 ranged GET, an HTTP range request): the header and the file's tail, read together, then
/// at most one more read for the part of a large manifest the tail did not hold.
#[derive(Debug, Clone)]
pub struct ManifestReads {
    file_len: u64,
    tail: Range<u64>,
}

/// Where a manifest is, once the header and the tail have been read.
#[derive(Debug, Clone)]
pub struct Located {
    pub container: Container,
    /// The manifest's bytes in the file.
    pub span: Range<u64>,
    /// The manifest's bytes before the tail, still to be read (empty when the tail holds them).
    pub missing: Range<u64>,
    /// The XXH3-64 the manifest bytes must hash to (v2).
    hash: Option<u64>,
    file_len: u64,
    tail_start: u64,
}

impl ManifestReads {
    /// Reads of a `file_len`-byte file whose tail read is `suffix` bytes (at least
    /// [`MAX_TRAILER_LEN`], at most the file): a larger suffix often holds a whole manifest.
    pub fn new(file_len: u64, suffix: u64) -> ManifestReads {
        ManifestReads { file_len, tail: file_len - suffix.max(MAX_TRAILER_LEN).min(file_len)..file_len }
    }

    /// The first read: the container's magic.
    pub fn head(&self) -> Range<u64> {
        0..self.file_len.min(HEADER_LEN)
    }

    /// The read made with the first: the file's last bytes.
    pub fn tail(&self) -> Range<u64> {
        self.tail.clone()
    }

    /// Identifies the container from `head` and finds the manifest from the trailer at the end
    /// of `tail` (checking the footer, the size field and the size limit).
    pub fn locate(&self, head: &[u8], tail: &[u8], limits: &Limits) -> Result<Located> {
        let container = Container::sniff(head)?;
        let (span, hash) = manifest_span(container, self.file_len, tail, limits)?;
        let missing = span.start.min(self.tail.start)..self.tail.start.min(span.end);
        Ok(Located { container, span, missing, hash, file_len: self.file_len, tail_start: self.tail.start })
    }
}

impl Located {
    /// Decodes and validates the manifest from the `tail` read and the `missing` bytes.
    pub fn parse(&self, tail: &[u8], missing: &[u8], limits: &Limits) -> Result<Manifest> {
        let in_tail = |at: u64| (at.max(self.tail_start) - self.tail_start) as usize;
        let from_tail = &tail[in_tail(self.span.start)..in_tail(self.span.end)];
        let whole = if missing.is_empty() {
            std::borrow::Cow::Borrowed(from_tail)
        } else {
            [missing, from_tail].concat().into()
        };
        if let Some(hash) = self.hash {
            v2::check_manifest_hash(&whole, hash)?;
        }
        parse_manifest(self.container, &whole, self.span.clone(), self.file_len, limits)
    }
}
