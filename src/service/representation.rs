//! What a request gets: a representation's bytes as a [`RangeSource`] (a slice of a mapped
//! file, a remote range, a decode) opened only when a body is sent, and the [`Guard`] a body's
//! last piece waits for (a digest check still running).

use std::ops::Range;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream;
use futures_util::{FutureExt as _, StreamExt as _};

use super::ServiceError;
pub(crate) use crate::served::{Guard, guard};

/// Bytes of a representation as a stream of pieces.
pub(crate) type ByteStream = crate::served::ByteStream<ServiceError>;

/// Holds each piece back until the next arrives, and the last until `guard` passes
/// ([`crate::served::guarded`]).
pub(crate) fn guarded(body: ByteStream, guard: Guard) -> ByteStream {
    crate::served::guarded(body, guard)
}

/// Where a representation's bytes come from; transport sends it as a
/// [`crate::served::ByteSource`].
pub(crate) trait RangeSource: crate::served::ByteSource<Error = ServiceError> {
    fn len(&self) -> u64;
    /// The bytes of `range` (within `0..len`). Called only when a body is sent, never for
    /// HEAD or 304, so opening may start work such as decoding.
    fn open(&self, range: Range<u64>) -> ByteStream;

    /// The longest gap between two wanted ranges that costs less to read through (and drop)
    /// than to open anew for the second: what one open costs (a request to a store, a frame
    /// to decode) in bytes. By default none: each range is opened on its own.
    fn gap_worth_reading(&self) -> BoxFuture<'_, Result<u64, ServiceError>> {
        futures_util::future::ready(Ok(0)).boxed()
    }
}

/// Every source of the service is one transport sends, failing as the service fails.
impl<S: RangeSource> crate::served::ByteSource for S {
    type Error = ServiceError;

    fn byte_len(&self) -> u64 {
        self.len()
    }

    fn open_range(&self, range: Range<u64>) -> ByteStream {
        self.open(range)
    }
}

/// Largest piece a byte slice is sent in: pieces let a guard hold back only the end of a
/// body, and are large enough that hyper writes each with one system call.
const SLICE_PIECE: usize = 4 << 20;

/// Bytes already in memory or mapped: served by reference, in pieces.
impl RangeSource for Bytes {
    fn len(&self) -> u64 {
        Bytes::len(self) as u64
    }

    fn open(&self, range: Range<u64>) -> ByteStream {
        let bytes = self.slice(range.start as usize..range.end as usize);
        crate::storage::record_mapped("serve", bytes.len() as u64);
        let pieces = (0..bytes.len())
            .step_by(SLICE_PIECE)
            .map(move |at| Ok(bytes.slice(at..(at + SLICE_PIECE).min(bytes.len()))));
        stream::iter(pieces).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_guarded_body_never_polls_its_body_after_the_body_ended() {
        // An unfold panics when polled after it ended: the guarded body must not do that.
        let body = stream::unfold(0u8, |n| async move { (n < 2).then(|| (Ok(Bytes::from(vec![n])), n + 1)) }).boxed();
        let mut guarded = guarded(body, guard(async { Ok(()) }));
        let mut pieces = Vec::new();
        while let Some(piece) = guarded.next().await {
            pieces.push(piece.unwrap());
        }
        assert_eq!(pieces, [Bytes::from_static(&[0]), Bytes::from_static(&[1])]);
    }
}
