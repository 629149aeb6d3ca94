//! Turning stored bytes into served bytes, incrementally and within bounds: zstd frames are
//! decoded into caller-provided buffers a piece at a time and may produce exactly the declared
//! size (never more, never less, never zero-padded); legacy big-endian data is byte-swapped to
//! little-endian; digests over the stored bytes are computed as the bytes pass.

use std::borrow::Cow;

use sha2::Digest as _;
use zstd::stream::raw::{InBuffer, Operation, OutBuffer};

use super::{ByteOrder, Component, Digest, Encoding, FormatError, Location, Result};

/// How far one [`Decoder::decode`] call got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// Stored bytes taken from the input.
    pub consumed: usize,
    /// Decoded bytes written to the start of the output.
    pub written: usize,
}

enum Stage {
    Copy,
    Zstd { context: Box<zstd::stream::raw::Decoder<'static>>, in_frame: bool },
}

/// An incremental decoder for one component's stored bytes.
pub struct Decoder {
    at: Location,
    stage: Stage,
    declared: u64,
    produced: u64,
    /// Element width to byte-swap, for big-endian legacy data.
    swap_width: Option<usize>,
    /// Decoded bytes of an element not yet complete, held back until it is (swapping only).
    carry: [u8; 8],
    carry_len: usize,
}

impl Decoder {
    pub fn new(object: &str, component: &Component) -> Result<Decoder> {
        let at = Location::component(object, &component.role);
        let stage = match &component.encoding {
            Encoding::Raw => Stage::Copy,
            Encoding::Unregistered(name) => {
                return Err(FormatError::UnknownEncoding { at, encoding: name.to_string() });
            }
            // A seekable stream is zstd frames and a skippable frame: one streaming decoder
            // reads it whole ([`decode_component`] also checks it frame by frame).
            Encoding::Zstd | Encoding::ZstdSeekable => {
                let context = zstd::stream::raw::Decoder::new()
                    .map_err(|e| FormatError::ZstdCorrupt { at: at.clone(), detail: e.to_string() })?;
                // Until a frame completes, the input is not a valid encoding (empty input included).
                Stage::Zstd { context: Box::new(context), in_frame: true }
            }
        };
        let width = component.dtype.width() as usize;
        let swap_width = (component.byte_order == ByteOrder::Big && width > 1).then_some(width);
        Ok(Decoder {
            at,
            stage,
            declared: component.decoded_length,
            produced: 0,
            swap_width,
            carry: [0; 8],
            carry_len: 0,
        })
    }

    /// Decoded bytes produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// Decodes from `input` into `output` (at least 16 bytes). Call again with the unconsumed
    /// input (or with none, to drain) until it writes nothing and consumes everything.
    pub fn decode(&mut self, input: &[u8], output: &mut [u8]) -> Result<Step> {
        debug_assert!(output.len() >= 16, "output buffer too small for carrying an element");
        let carried = self.carry_len;
        output[..carried].copy_from_slice(&self.carry[..carried]);
        self.carry_len = 0;
        let room = &mut output[carried..];
        // Bound the room so a frame that inflates past its declaration is caught one byte past
        // it, not after filling a whole buffer.
        let left = self.declared - self.produced;
        let limit = room.len().min(usize::try_from(left.saturating_add(1)).unwrap_or(usize::MAX));
        let (consumed, written) = match &mut self.stage {
            Stage::Copy => {
                let n = input.len().min(limit);
                room[..n].copy_from_slice(&input[..n]);
                (n, n)
            }
            Stage::Zstd { context, in_frame } => {
                let mut src = InBuffer::around(input);
                let mut dst = OutBuffer::around(&mut room[..limit]);
                let hint = context.run(&mut src, &mut dst).map_err(|e| zstd_error(&self.at, e))?;
                // A hint of 0 means a frame ended and everything was flushed. A call that
                // moved nothing (the final drain) says nothing about frame state.
                if src.pos() > 0 || dst.pos() > 0 {
                    *in_frame = hint != 0;
                }
                (src.pos(), dst.pos())
            }
        };
        self.produced += written as u64;
        if self.produced > self.declared {
            return Err(match self.stage {
                Stage::Zstd { .. } => FormatError::ZstdTooLong { at: self.at.clone(), declared: self.declared },
                Stage::Copy => FormatError::StoredLengthMismatch {
                    at: self.at.clone(),
                    expected: self.declared,
                    actual: self.produced,
                },
            });
        }
        let total = carried + written;
        let complete = match self.swap_width {
            None => total,
            Some(width) => {
                let whole = total / width * width;
                for element in output[..whole].chunks_exact_mut(width) {
                    element.reverse();
                }
                self.carry_len = total - whole;
                self.carry[..self.carry_len].copy_from_slice(&output[whole..total]);
                whole
            }
        };
        Ok(Step { consumed, written: complete })
    }

    /// Confirms that all input was a complete encoding of exactly the declared size.
    pub fn finish(&self) -> Result<()> {
        if let Stage::Zstd { in_frame: true, .. } = self.stage {
            return Err(FormatError::ZstdTruncated { at: self.at.clone() });
        }
        if self.produced < self.declared {
            return Err(match self.stage {
                Stage::Zstd { .. } => {
                    FormatError::ZstdTooShort { at: self.at.clone(), produced: self.produced, declared: self.declared }
                }
                Stage::Copy => FormatError::StoredLengthMismatch {
                    at: self.at.clone(),
                    expected: self.declared,
                    actual: self.produced,
                },
            });
        }
        debug_assert_eq!(self.carry_len, 0, "a complete decode leaves no partial element");
        Ok(())
    }
}

fn zstd_error(at: &Location, error: std::io::Error) -> FormatError {
    FormatError::ZstdCorrupt { at: at.clone(), detail: error.to_string() }
}

/// Feeds all of `stored` through a decoder, handing each decoded piece to `sink`. `buffer` is
/// the scratch the pieces are decoded into; its size sets the piece size.
pub fn decode_with<E>(
    object: &str,
    component: &Component,
    stored: &[u8],
    buffer: &mut [u8],
    mut sink: impl FnMut(&[u8]) -> std::result::Result<(), E>,
) -> std::result::Result<(), E>
where
    E: From<FormatError>,
{
    let mut decoder = Decoder::new(object, component)?;
    let mut input = stored;
    loop {
        let progress = decoder.decode(input, buffer)?;
        input = &input[progress.consumed..];
        if progress.written > 0 {
            sink(&buffer[..progress.written])?;
        }
        if input.is_empty() && progress.written == 0 && progress.consumed == 0 {
            break;
        }
    }
    decoder.finish()?;
    Ok(())
}

/// Size of the decoded pieces a whole-component decode produces: small enough to stay in L2
/// cache between the decoder writing a piece and the consumer reading it (the `zstd` CLI uses
/// 128 KiB for the same reason).
pub const DECODE_PIECE: usize = 128 << 10;

/// Most bytes reserved up front for a decode, whatever the manifest declares.
const PREALLOCATE_AT_MOST: u64 = 64 << 20;

/// The decoded little-endian bytes of a component, borrowed when no decoding is needed.
pub fn decode_component<'a>(object: &str, component: &Component, stored: &'a [u8]) -> Result<Cow<'a, [u8]>> {
    check_stored_len(object, component, stored)?;
    if component.is_verbatim() {
        return Ok(Cow::Borrowed(stored));
    }
    if component.encoding == Encoding::ZstdSeekable {
        return decode_seekable(object, component, stored).map(Cow::Owned);
    }
    // The declared size is within the limit, but it is only a claim until the frame proves it:
    // reserve a bounded amount and let real output grow the buffer.
    let mut out = Vec::with_capacity(component.decoded_length.min(PREALLOCATE_AT_MOST) as usize);
    let mut buffer = vec![0u8; DECODE_PIECE];
    decode_with::<FormatError>(object, component, stored, &mut buffer, |piece| {
        out.extend_from_slice(piece);
        Ok(())
    })?;
    Ok(Cow::Owned(out))
}

/// A seekable part decoded frame by frame, each to exactly the size its table entry declares.
fn decode_seekable(object: &str, component: &Component, stored: &[u8]) -> Result<Vec<u8>> {
    let at = Location::component(object, &component.role);
    let table = crate::seekable::SeekTable::of_stored(&at, stored, component.decoded_length)?;
    let mut out = Vec::with_capacity(component.decoded_length.min(PREALLOCATE_AT_MOST) as usize);
    for index in 0..table.frame_count() {
        let range = table.stored(index);
        let frame = &stored[range.start as usize..range.end as usize];
        out.extend_from_slice(&decode_frame(object, &table.frame_component(component, index), frame)?);
    }
    Ok(out)
}

/// One frame of a seekable part (`frame`, as [`crate::seekable::SeekTable::frame_component`]
/// describes it: the table bounds its size by 16 MiB) decoded in one call, straight into a
/// buffer of exactly its declared size: no window buffer to copy through, nothing zeroed first.
pub fn decode_frame(object: &str, frame: &Component, stored: &[u8]) -> Result<Vec<u8>> {
    thread_local! {
        static CONTEXT: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
            const { std::cell::RefCell::new(None) };
    }
    let at = || Location::component(object, &frame.role);
    if frame.encoding == Encoding::ZstdSeekable {
        crate::seekable::check_frame_checksum(&at(), stored)?;
    }
    let declared = usize::try_from(frame.decoded_length)
        .map_err(|_| FormatError::ZstdTooLong { at: at(), declared: frame.decoded_length })?;
    // Room for exactly the declared size: a frame inflating past it fails unwritten.
    let mut out = Vec::with_capacity(declared);
    let decoded = CONTEXT.with_borrow_mut(|context| {
        let context = match context {
            Some(context) => context,
            None => context.insert(zstd::bulk::Decompressor::new().map_err(|e| zstd_error(&at(), e))?),
        };
        Ok::<_, FormatError>(context.decompress_to_buffer(stored, &mut out))
    })?;
    if matches!(decoded, Ok(n) if n == declared) {
        return Ok(out);
    }
    // Rare: the streaming decoder says precisely what is wrong (truncated, short, long, corrupt).
    decode_with::<FormatError>(object, frame, stored, &mut vec![0u8; DECODE_PIECE], |_| Ok(()))?;
    Err(FormatError::ZstdCorrupt {
        at: at(),
        detail: "the frame decodes differently in one call than in pieces".into(),
    })
}

fn check_stored_len(object: &str, component: &Component, stored: &[u8]) -> Result<()> {
    if stored.len() as u64 != component.stored_length {
        return Err(FormatError::StoredLengthMismatch {
            at: Location::component(object, &component.role),
            expected: component.stored_length,
            actual: stored.len() as u64,
        });
    }
    Ok(())
}

/// A digest being computed over stored bytes as they pass.
pub enum Hasher {
    Crc32c(u32),
    Sha256(Box<sha2::Sha256>),
    Xxh3(Box<xxhash_rust::xxh3::Xxh3>),
    /// For a digest of an algorithm this reader cannot compute: checks pass over it.
    Unverifiable,
}

impl Hasher {
    /// A hasher for the same algorithm as `digest`.
    pub fn for_digest(digest: &Digest) -> Hasher {
        match digest {
            Digest::Crc32c(_) => Hasher::Crc32c(0),
            Digest::Sha256(_) => Hasher::Sha256(Box::default()),
            Digest::Xxh3(_) => Hasher::Xxh3(Box::default()),
            Digest::Unregistered(_) => Hasher::Unverifiable,
        }
    }

    pub fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Crc32c(crc) => *crc = crc32c::crc32c_append(*crc, bytes),
            Hasher::Sha256(h) => h.update(bytes),
            Hasher::Xxh3(h) => h.update(bytes),
            Hasher::Unverifiable => {}
        }
    }

    /// The digest computed; `None` for an unverifiable one.
    pub fn finish(self) -> Option<Digest> {
        match self {
            Hasher::Crc32c(crc) => Some(Digest::Crc32c(crc)),
            Hasher::Sha256(h) => Some(Digest::Sha256(h.finalize().into())),
            Hasher::Xxh3(h) => Some(Digest::Xxh3(h.digest())),
            Hasher::Unverifiable => None,
        }
    }
}

/// Computes `digest`'s algorithm over `stored` and compares.
pub fn verify_digest(object: &str, component: &Component, stored: &[u8]) -> Result<()> {
    let Some(expected) = &component.digest else { return Ok(()) };
    let mut hasher = Hasher::for_digest(expected);
    hasher.update(stored);
    check_digest(object, component, hasher.finish())
}

/// Compares a computed digest with the declared one (`None`: nothing could be computed).
pub fn check_digest(object: &str, component: &Component, actual: Option<Digest>) -> Result<()> {
    match (&component.digest, actual) {
        (Some(expected), Some(actual)) if *expected != actual => Err(FormatError::DigestMismatch {
            at: Location::component(object, &component.role),
            algorithm: expected.algorithm(),
            expected: expected.to_string(),
            actual: actual.to_string(),
        }),
        _ => Ok(()),
    }
}

/// The stored bytes of a component within a whole file.
pub fn stored_bytes<'a>(file: &'a [u8], object: &str, component: &Component) -> Result<&'a [u8]> {
    let range = component.stored_range();
    let at = || Location::component(object, &component.role);
    usize::try_from(range.end)
        .ok()
        .and_then(|end| file.get(range.start as usize..end))
        .ok_or_else(|| FormatError::StoredLengthMismatch { at: at(), expected: range.end, actual: file.len() as u64 })
}
