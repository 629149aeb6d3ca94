//! A private decode for one reader, keeping nothing: for components the cache cannot hold.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;

use tokio::sync::Semaphore;

use super::cursor::{Cursor, Stop, record_failure};
use super::source::{Input, Stored};
use super::{CHUNK, DecodeError};
use crate::format::Component;

/// A private decode's position.
pub(super) struct Walk {
    pub(super) cursor: Option<Cursor>,
    pub(super) input: Input,
    pub(super) produced: u64,
    /// The overlap of the piece that ends the component, held until the encoding is proved
    /// complete.
    pub(super) last: Option<Bytes>,
    pub(super) finished: bool,
}

/// What one private decoding step produced.
pub(super) enum Private {
    Piece(Bytes),
    NeedInput,
    End,
}

/// Decodes `range` of a component for one reader, one chunk at a time, keeping nothing:
/// for components the cache cannot hold. Bytes before the range are decoded and dropped; no
/// decoder or thread is held while the reader is slow to take the next piece, or while
/// remote stored bytes are on their way.
pub(crate) fn stream_private(
    object: String,
    component: Component,
    stored: Stored,
    range: Range<u64>,
    decoders: Arc<Semaphore>,
) -> impl Stream<Item = Result<Bytes, DecodeError>> + Send + 'static {
    let walk = Walk { cursor: None, input: Input::new(&stored), produced: 0, last: None, finished: range.is_empty() };
    let shared = Arc::new((object, component, stored, decoders, range));
    futures_util::stream::unfold(walk, move |mut walk| {
        let shared = Arc::clone(&shared);
        async move {
            loop {
                if walk.finished {
                    return None;
                }
                if walk.input.starved() {
                    if let Err(e) = walk.input.fill(&shared.2).await {
                        let error = DecodeError::Storage(e);
                        record_failure(&error);
                        walk.finished = true;
                        return Some((Err(error), walk));
                    }
                }
                let permit =
                    Arc::clone(&shared.3).acquire_owned().await.expect("the decoder semaphore is never closed");
                let shared = Arc::clone(&shared);
                let stepped = tokio::task::spawn_blocking(move || {
                    let (object, component, stored, _, range) = &*shared;
                    let result = next_private_piece(&mut walk, object, component, stored, range);
                    drop(permit);
                    (walk, result)
                })
                .await;
                match stepped {
                    Ok((next, Ok(Private::Piece(piece)))) => return Some((Ok(piece), next)),
                    Ok((next, Ok(Private::NeedInput))) => walk = next,
                    Ok((_, Ok(Private::End))) => return None,
                    Ok((mut next, Err(e))) => {
                        record_failure(&e);
                        next.finished = true;
                        return Some((Err(e), next));
                    }
                    Err(e) => {
                        let error = DecodeError::Aborted(e.to_string());
                        record_failure(&error);
                        return Some((Err(error), Walk::done()));
                    }
                }
            }
        }
    })
}

impl Walk {
    pub(super) fn done() -> Walk {
        Walk { cursor: None, input: Input::empty(), produced: 0, last: None, finished: true }
    }
}

/// Decodes until a piece overlaps `range` and returns that overlap; the piece that ends the
/// component comes only after the encoding is proved complete. A local file's stored bytes
/// are read here; remote ones are asked for with [`Private::NeedInput`].
pub(super) fn next_private_piece(
    walk: &mut Walk,
    object: &str,
    component: &Component,
    stored: &Stored,
    range: &Range<u64>,
) -> Result<Private, DecodeError> {
    let len = component.decoded_length;
    let cursor = match &mut walk.cursor {
        Some(cursor) => cursor,
        None => walk.cursor.insert(Cursor::new(object, component, CHUNK)?),
    };
    loop {
        if walk.last.is_some() {
            // Everything is decoded: drain to the proved end before the last piece goes.
            let (rest, stop) = cursor.next_piece(&mut walk.input, len)?;
            debug_assert!(rest.is_empty(), "the decoder refuses bytes past the declared length");
            match stop {
                Stop::Done => {
                    walk.finished = true;
                    return Ok(Private::Piece(walk.last.take().expect("checked")));
                }
                Stop::Starved => match walk.input.read_here(stored) {
                    Some(read) => {
                        read?;
                        continue;
                    }
                    None => return Ok(Private::NeedInput),
                },
                Stop::Full => continue,
            }
        }
        let (piece, stop) = cursor.next_piece(&mut walk.input, len)?;
        let start = walk.produced;
        walk.produced += piece.len() as u64;
        let (low, high) = (range.start.max(start), range.end.min(walk.produced));
        if low < high {
            let overlap = piece.slice((low - start) as usize..(high - start) as usize);
            if high == len && stop != Stop::Done {
                walk.last = Some(overlap);
                continue;
            }
            if high >= range.end {
                walk.finished = true;
            }
            return Ok(Private::Piece(overlap));
        }
        if stop == Stop::Done || walk.produced >= range.end {
            walk.finished = true;
            return Ok(Private::End);
        }
        if stop == Stop::Starved {
            match walk.input.read_here(stored) {
                Some(read) => read?,
                None => return Ok(Private::NeedInput),
            }
        }
    }
}
