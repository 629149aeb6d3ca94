//! Connections that can send mapped file bytes without copying them (`server.sendfile`).
//! Responses stay ordinary hyper bodies of `Bytes`; hyper hands each write to the socket as a
//! list of slices. By default the slices are written with `writev`, the kernel copying mapped
//! bytes straight from the page cache (a file truncated under it fails the write with
//! `EFAULT`; nothing in the process loads from a mapping, so no SIGBUS). This socket looks
//! every large slice up among the live mappings (`storage::mapped::file_behind`) and sends a
//! slice of a mapped file with `sendfile` from that file, at the same offset, as nginx does,
//! when `sendfile` is on or the mapping asks for it (a rendered manifest, sent whole to many
//! clients: the copy was a third of the server's CPU at 32 connections); everything else
//! (headers, decoded bytes, small JSON) is written as before, and what precedes a mapped slice is sent with `MSG_MORE`, so headers and
//! body still leave in full segments despite `TCP_NODELAY`. On loopback (kernel 6.18, 2 cores),
//! `writev` was the faster: a 1 GiB blob took 0.25 s with it against 0.64–0.69 s with
//! `sendfile` for curl, and 0.22–0.37 s against 0.58–0.67 s for a client reading 8 KiB at a
//! time (nginx with `sendfile on`: 0.66–0.70 s and 0.57 s), A/B on the same machine. The
//! socket is not corked (`TCP_CORK`, nginx's `tcp_nopush`): corked from a response's first
//! `sendfile` until hyper's flush, full GETs of 1 GiB were no faster (394 ± 48 ms against
//! 406 ± 69 ms) and random 1 MiB ranges at 4 connections 25% slower (about 9,500 against
//! 12,500 requests in 5 s), A/B on the same machine.

use std::fs::File;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Slices shorter than this are copied: below it one more system call costs more than the copy.
const SENDFILE_MIN: usize = 64 << 10;

/// Registered once (after the recorder is installed): the macro would look the counter up on
/// every write.
static SENDFILE_BYTES: std::sync::LazyLock<metrics::Counter> = std::sync::LazyLock::new(|| {
    crate::telemetry::metrics();
    metrics::counter!(crate::telemetry::names::SENDFILE_BYTES)
});

/// A TCP connection that sends slices of mapped files with `sendfile`, when on.
pub(super) struct ZeroCopyStream {
    stream: TcpStream,
    sendfile: bool,
}

impl ZeroCopyStream {
    /// Also sets `TCP_NODELAY`: bodies are written in large pieces, and Nagle's algorithm
    /// would only hold back the last, short segment of each response until the client's
    /// delayed ACK.
    pub(super) fn new(stream: TcpStream, sendfile: bool) -> ZeroCopyStream {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        ZeroCopyStream { stream, sendfile }
    }
}

/// What the next write does with the slices it is given.
enum Next {
    /// Write the first `count` slices; `more` when a mapped slice follows them.
    Copy { count: usize, more: bool },
    /// Send `len` bytes of `file` from `offset`: the first slice.
    Send { file: Arc<File>, offset: u64, len: usize },
}

/// How the slices `bufs` are written next; with `sendfile` off, only mappings that ask for
/// it are sent from their file.
fn next(bufs: &[IoSlice<'_>], sendfile: bool) -> Next {
    let mut before = 0;
    for (i, buf) in bufs.iter().enumerate() {
        if buf.len() >= SENDFILE_MIN {
            if let Some(behind) = crate::storage::mapped::file_behind(buf).filter(|b| sendfile || b.always_sendfile) {
                // Empty slices before it count for nothing: writing them alone would return
                // 0, which hyper takes for a closed connection.
                return match before {
                    0 => Next::Send { file: behind.file, offset: behind.offset, len: buf.len() },
                    _ => Next::Copy { count: i, more: true },
                };
            }
        }
        before += buf.len();
    }
    Next::Copy { count: bufs.len(), more: false }
}

/// Runs a non-blocking write `op` when the socket is writable, waiting again while it would
/// block (tokio's readiness protocol for system calls it does not wrap).
fn poll_writing(
    stream: &TcpStream,
    cx: &mut Context<'_>,
    mut op: impl FnMut() -> io::Result<usize>,
) -> Poll<io::Result<usize>> {
    loop {
        ready!(stream.poll_write_ready(cx))?;
        match stream.try_io(Interest::WRITABLE, &mut op) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            done => return Poll::Ready(done),
        }
    }
}

impl AsyncWrite for ZeroCopyStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match next(bufs, this.sendfile) {
            Next::Copy { count, more: false } => Pin::new(&mut this.stream).poll_write_vectored(cx, &bufs[..count]),
            Next::Copy { count, more: true } => poll_writing(&this.stream, cx, || {
                let flags = rustix::net::SendFlags::MORE | rustix::net::SendFlags::NOSIGNAL;
                Ok(rustix::net::sendmsg(&this.stream, &bufs[..count], &mut Default::default(), flags)?)
            }),
            Next::Send { file, offset, len } => {
                let stream = &this.stream;
                let sent = ready!(poll_writing(stream, cx, || {
                    let mut at = offset;
                    Ok(rustix::fs::sendfile(&*stream, &*file, Some(&mut at), len)?)
                }))?;
                // The mapping still spans these bytes, so the file was truncated under it:
                // end the response rather than let hyper write the rest from the mapping.
                if sent == 0 {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the mapped file was truncated",
                    )));
                }
                SENDFILE_BYTES.increment(sent as u64);
                Poll::Ready(Ok(sent))
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl AsyncRead for ZeroCopyStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_file_leaves_with_sendfile_only_when_it_is_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.bin");
        std::fs::write(&path, vec![7u8; 100_000]).unwrap();
        let mapped = crate::storage::mapped::MappedFile::open(&path).unwrap();
        let slice = [IoSlice::new(&mapped[..])];
        assert!(matches!(next(&slice, false), Next::Copy { count: 1, more: false }), "writev by default");
        assert!(matches!(next(&slice, true), Next::Send { offset: 0, len: 100_000, .. }));
    }

    #[test]
    fn a_mapped_slice_is_sent_from_its_file_after_what_precedes_it_is_written() {
        let bytes: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mapped = crate::storage::mapped::MappedFile::temporary(&bytes).unwrap();
        let head = b"HTTP/1.1 200 OK\r\n\r\n";
        let small = &mapped[..1000];
        let large = &mapped[1000..150_000];
        let sent_from = |next: Next| match next {
            Next::Send { offset, len, .. } => Some((offset, len)),
            Next::Copy { .. } => None,
        };
        let copied = |next: Next| match next {
            Next::Copy { count, more } => Some((count, more)),
            Next::Send { .. } => None,
        };
        assert_eq!(sent_from(next(&[IoSlice::new(large), IoSlice::new(head)], false)), Some((1000, 149_000)));
        assert_eq!(sent_from(next(&[IoSlice::new(&[]), IoSlice::new(large)], false)), Some((1000, 149_000)));
        assert_eq!(
            copied(next(&[IoSlice::new(head), IoSlice::new(small), IoSlice::new(large)], false)),
            Some((2, true))
        );
        assert_eq!(
            copied(next(&[IoSlice::new(head), IoSlice::new(small)], false)),
            Some((2, false)),
            "small slices are copied"
        );
        let heap = bytes[1000..150_000].to_vec();
        assert_eq!(copied(next(&[IoSlice::new(&heap)], false)), Some((1, false)), "heap bytes are copied");
    }
}
