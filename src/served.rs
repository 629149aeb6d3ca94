//! What is served, in the words both the service that makes it and the transport that sends
//! it use: a representation's bytes from a [`ByteSource`] as a [`ByteStream`], the [`Guard`]
//! its last piece waits for, and a failure as a client may be told of it ([`ClientFacing`],
//! [`INTERNAL_MESSAGE`]). It lies below both, since the service may not import transport (it
//! is above it) and transport may not import the service (it would then know the domain).

use std::ops::Range;

use bytes::Bytes;
use futures_util::FutureExt as _;
use futures_util::future::{BoxFuture, Shared};
use futures_util::stream::BoxStream;

/// Bytes of a representation as a stream of pieces, each failing with `E`.
pub(crate) type ByteStream<E> = BoxStream<'static, Result<Bytes, E>>;

/// A check running while a body streams (a digest over the stored bytes): the body's last
/// piece is held back until it passes.
pub(crate) type Guard = Shared<BoxFuture<'static, Result<(), String>>>;

/// A guard from a check's future.
pub(crate) fn guard(check: impl std::future::Future<Output = Result<(), String>> + Send + 'static) -> Guard {
    check.boxed().shared()
}

/// An error a body can end with when its guard fails.
pub(crate) trait BodyAborted {
    /// The error of a body whose guard failed for `reason`.
    fn body_aborted(reason: String) -> Self;
}

/// Holds each piece back until the next arrives, and the last until `guard` passes; a failed
/// guard ends the body with an error instead, which aborts the response.
pub(crate) fn guarded<E: BodyAborted + Send + 'static>(body: ByteStream<E>, guard: Guard) -> ByteStream<E> {
    let check = async move { guard.await.map_err(E::body_aborted) };
    crate::storage::last_held_until(body, check)
}

/// Where a representation's bytes come from, as transport sends them. (Named apart from the
/// service's `RangeSource`, which extends it, so that no call is ambiguous.)
pub(crate) trait ByteSource: Send + Sync + 'static {
    type Error;
    fn byte_len(&self) -> u64;
    /// The bytes of `range` (within `0..byte_len`). Called only when a body is sent, never
    /// for HEAD or 304, so opening may start work such as decoding.
    fn open_range(&self, range: Range<u64>) -> ByteStream<Self::Error>;
}

/// What a client is told in place of the server's own fault, whose detail is only logged.
pub(crate) const INTERNAL_MESSAGE: &str = "internal error; see the server log";

/// A failure as a client may be told of it, whatever protocol tells it.
pub(crate) trait ClientFacing: std::fmt::Debug {
    /// What a client may read of it.
    fn message_for_client(&self) -> String;
    /// Seconds to wait before trying again, where waiting helps.
    fn retry_after_secs(&self) -> Option<u64>;
}
