//! A decoder partway through a component's stored bytes, producing pieces into blocks whose
//! pages are touched ahead of time on the blocking pool.

use bytes::{Bytes, BytesMut};

use super::source::Input;
use super::{CHUNK, DecodeError};
use crate::format::decode::Decoder;
use crate::format::{Component, Encoding, FormatError};
use crate::telemetry::names;

/// Where a decoding step stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stop {
    /// The piece is full; more may follow.
    Full,
    /// The input ran dry before the piece was full; more stored bytes are on their way.
    Starved,
    /// The whole encoding has been consumed and proved complete.
    Done,
}

pub(super) fn encoding_label(component: &Component) -> &'static str {
    match component.encoding {
        Encoding::Zstd | Encoding::ZstdSeekable => "zstd",
        Encoding::Raw => "byteswap",
        Encoding::Unregistered(_) => "unregistered",
    }
}

/// Decoded pieces are cut from blocks this large: one allocation per 16 pieces.
pub(super) const BLOCK: usize = 16 * CHUNK;

/// A decoder partway through a component's stored bytes.
pub(super) struct Cursor {
    pub(super) decoder: Decoder,
    pub(super) encoding: &'static str,
    /// The unused rest of the current block; each piece is split off its front.
    pub(super) block: BytesMut,
    /// The next block, being made ready on another thread.
    pub(super) next_block: Option<std::sync::mpsc::Receiver<BytesMut>>,
    /// Bytes per block: [`BLOCK`] for a cached decode, whose chunks stay together; [`CHUNK`]
    /// for a private one, whose pieces are freed as they are sent (a larger block would live
    /// until its last piece is sent, and one more would be made ready).
    pub(super) block_len: usize,
}

/// A zeroed block whose pages have all been touched. The kernel zeroes an anonymous page on
/// its first touch; done on the decoder's thread, that would stall decoding, so the decoder
/// takes blocks touched ahead of time on a blocking-pool thread (bench/README.md: "Design
/// choices measured").
pub(super) fn touched_block(len: usize) -> BytesMut {
    let mut block = BytesMut::zeroed(len);
    for page in (0..len).step_by(4096) {
        block[page] = 0;
    }
    // The stores must happen even though the allocator promised zeroes.
    std::hint::black_box(&mut block[..]);
    block
}

impl Cursor {
    pub(super) fn new(object: &str, component: &Component, block_len: usize) -> Result<Cursor, FormatError> {
        let decoder = Decoder::new(object, component)?;
        metrics::counter!(names::DECODES_STARTED, "encoding" => encoding_label(component)).increment(1);
        Ok(Cursor { decoder, encoding: encoding_label(component), block: BytesMut::new(), next_block: None, block_len })
    }

    /// Decodes the next piece (at most [`CHUNK`] bytes) from `input`. [`Stop::Done`] once the
    /// whole encoding has been consumed and proved complete; the last bytes come with it or
    /// before it.
    pub(super) fn next_piece(&mut self, input: &mut Input, declared: u64) -> Result<(Bytes, Stop), FormatError> {
        // 16 bytes past the declared end let an over-long encoding show itself.
        let left = declared - self.decoder.produced();
        let room = usize::try_from(left.saturating_add(16)).unwrap_or(usize::MAX);
        let size = room.min(CHUNK);
        if self.block.len() < size {
            // Never more than the component can still need, so small components stay small.
            let len = room.min(self.block_len);
            let ready = self.next_block.take().and_then(|next| next.recv().ok()).filter(|b| b.len() >= size);
            self.block = ready.unwrap_or_else(|| BytesMut::zeroed(len));
            let after = room.saturating_sub(self.block.len()).min(self.block_len);
            if after > 0 && self.block_len > CHUNK {
                self.next_block = prepare_block(after);
            }
        }
        let buffer = &mut self.block[..size];
        let mut filled = 0;
        let mut stop = Stop::Full;
        while size - filled >= 16 {
            let progress = self.decoder.decode(input.front(), &mut buffer[filled..])?;
            input.consume(progress.consumed);
            filled += progress.written;
            if progress.consumed == 0 && progress.written == 0 && !input.holds_bytes() {
                if input.starved() {
                    stop = Stop::Starved;
                } else {
                    self.decoder.finish()?;
                    stop = Stop::Done;
                }
                break;
            }
        }
        metrics::counter!(names::DECODED_BYTES, "encoding" => self.encoding).increment(filled as u64);
        Ok((self.block.split_to(filled).freeze(), stop))
    }
}

/// Starts making a block ready on the blocking pool; `None` outside a runtime.
pub(super) fn prepare_block(len: usize) -> Option<std::sync::mpsc::Receiver<BytesMut>> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let (ready, receiver) = std::sync::mpsc::sync_channel(1);
    runtime.spawn_blocking(move || ready.send(touched_block(len)));
    Some(receiver)
}

pub(super) fn record_failure(error: &DecodeError) {
    // Storage failures are the source's, counted and logged where the request fails.
    if !matches!(error, DecodeError::Storage(_)) {
        metrics::counter!(names::DECODE_FAILURES).increment(1);
        tracing::warn!(error = %error, "decoding failed");
    }
}
