//! A TCP proxy on 127.0.0.1 between a server and its origin that damages HTTP/1.1 exchanges:
//! it follows each connection's requests (heads only: the server sends no request bodies to an
//! origin) and responses (status, `Content-Length`). While `flip_body_byte` is set it flips one
//! byte of every body long enough to hold it; each [`Fault`] queued is done to the next ranged
//! request (one with a `Range` header: a read of an object's bytes, not a listing) or its
//! response. A chunked body is passed through untouched, and so is everything after it on that
//! connection.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// What is done to one ranged request or its response.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answered with this status (an S3-style error body; `Retry-After` on a 503 `SlowDown`)
    /// instead of the origin's answer.
    Status(u16),
    /// The response stops after this many body bytes and the connection stays open, silent.
    StallAfter(u64),
    /// The connection is reset (RST) after this many body bytes.
    ResetAfter(u64),
    /// The connection is closed cleanly (FIN) after this many body bytes, short of the length.
    CloseAfter(u64),
    /// The request's `Range` header is removed: the origin answers `200` with the whole object.
    DropRange,
    /// Answered with `302 Found` to the same path at this `HOST:PORT`.
    RedirectTo(String),
}

/// The proxy; it stops when dropped.
pub struct FaultProxy {
    pub address: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Shared {
    /// The body offset flipped in every response body longer than it (`u64::MAX`: none).
    flip_at: AtomicU64,
    /// Bodies damaged so far.
    flipped: AtomicU64,
    /// Faults for the next ranged requests, in order.
    faults: Mutex<VecDeque<Fault>>,
    /// Ranged requests seen, requests that carried `Authorization`, and requests that asked
    /// an S3 store for an object's checksum (`x-amz-checksum-mode`).
    ranged: AtomicU64,
    authorized: AtomicU64,
    checksum_asked: AtomicU64,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A request as the response side needs it.
struct Sent {
    head_only: bool,
    target: String,
    fault: Option<Fault>,
}

impl FaultProxy {
    /// A proxy to `upstream` (HOST:PORT), passing everything through until told otherwise.
    pub async fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let shared = Arc::new(Shared { flip_at: AtomicU64::new(u64::MAX), ..Shared::default() });
        let upstream = upstream.to_owned();
        let state = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, state) = (upstream.clone(), Arc::clone(&state));
                connections.spawn(async move {
                    if let Ok(origin) = TcpStream::connect(&upstream).await {
                        relay(client, origin, state).await;
                    }
                });
            }
        });
        FaultProxy { address, shared, task }
    }

    /// Flips the byte at `offset` of every response body longer than it, from now on.
    pub fn flip_body_byte(&self, offset: u64) {
        self.shared.flip_at.store(offset, Ordering::SeqCst);
    }

    /// Queues `fault` for the next ranged request not yet given one.
    pub fn inject(&self, fault: Fault) {
        self.shared.faults.lock().unwrap().push_back(fault);
    }

    /// Passes everything through again: no flips, no faults left queued.
    pub fn heal(&self) {
        self.shared.flip_at.store(u64::MAX, Ordering::SeqCst);
        self.shared.faults.lock().unwrap().clear();
    }

    /// Response bodies damaged so far.
    pub fn flipped(&self) -> u64 {
        self.shared.flipped.load(Ordering::SeqCst)
    }

    /// Ranged requests seen so far.
    pub fn ranged_requests(&self) -> u64 {
        self.shared.ranged.load(Ordering::SeqCst)
    }

    /// Requests seen so far that carried an `Authorization` header.
    pub fn authorized_requests(&self) -> u64 {
        self.shared.authorized.load(Ordering::SeqCst)
    }

    /// Requests seen so far that asked for an object's checksum (`x-amz-checksum-mode`).
    pub fn checksum_requests(&self) -> u64 {
        self.shared.checksum_asked.load(Ordering::SeqCst)
    }

    /// Faults queued and not yet done.
    pub fn faults_left(&self) -> usize {
        self.shared.faults.lock().unwrap().len()
    }
}

/// The request head `head` as sent on, and what the response side needs of it.
fn take_request(head: &[u8], shared: &Shared) -> (Vec<u8>, Sent) {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let target = request_line.split(' ').nth(1).unwrap_or("/").to_owned();
    let headers: Vec<&str> = lines.filter(|l| !l.is_empty()).collect();
    let named =
        |l: &&str, name: &str| l.len() > name.len() && l[..name.len() + 1].eq_ignore_ascii_case(&format!("{name}:"));
    if headers.iter().any(|l| named(l, "authorization")) {
        shared.authorized.fetch_add(1, Ordering::SeqCst);
    }
    if headers.iter().any(|l| named(l, "x-amz-checksum-mode")) {
        shared.checksum_asked.fetch_add(1, Ordering::SeqCst);
    }
    let ranged = headers.iter().any(|l| named(l, "range"));
    let fault = if ranged {
        shared.ranged.fetch_add(1, Ordering::SeqCst);
        shared.faults.lock().unwrap().pop_front()
    } else {
        None
    };
    let mut sent = head.to_vec();
    if matches!(fault, Some(Fault::DropRange)) {
        let kept: Vec<&str> = headers.into_iter().filter(|l| !named(l, "range")).collect();
        sent = format!("{request_line}\r\n{}\r\n\r\n", kept.join("\r\n")).into_bytes();
    }
    (sent, Sent { head_only: request_line.starts_with("HEAD "), target, fault })
}

/// The response sent instead of the origin's for `fault`, if it replaces it.
fn replacement(fault: &Fault, target: &str) -> Option<String> {
    let error = |status: u16, reason: &str, code: &str, extra: &str| {
        let body = format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>{reason}</Message></Error>");
        format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n{extra}\r\n{body}",
            body.len()
        )
    };
    match fault {
        Fault::Status(503) => Some(error(503, "Slow Down", "SlowDown", "retry-after: 1\r\n")),
        Fault::Status(status) => Some(error(*status, "Internal Server Error", "InternalError", "")),
        Fault::RedirectTo(host) => {
            Some(format!("HTTP/1.1 302 Found\r\nlocation: http://{host}{target}\r\ncontent-length: 0\r\n\r\n"))
        }
        _ => None,
    }
}

/// Relays one connection both ways, doing to it what `shared` says.
async fn relay(client: TcpStream, origin: TcpStream, shared: Arc<Shared>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut origin_read, mut origin_write) = origin.into_split();
    let (sent_tx, mut sent_rx) = tokio::sync::mpsc::unbounded_channel::<Sent>();
    let (cut_tx, mut cut_rx) = tokio::sync::oneshot::channel::<()>();
    let requests = {
        let shared = Arc::clone(&shared);
        async move {
            let (mut buffer, mut head) = ([0u8; 16384], Vec::new());
            loop {
                let n = tokio::select! {
                    read = client_read.read(&mut buffer) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    },
                    _ = &mut cut_rx => return client_read,
                };
                head.extend_from_slice(&buffer[..n]);
                while let Some(end) = find(&head, b"\r\n\r\n") {
                    let (bytes, sent) = take_request(&head[..end + 4], &shared);
                    head.drain(..end + 4);
                    let _ = sent_tx.send(sent);
                    if origin_write.write_all(&bytes).await.is_err() {
                        return client_read;
                    }
                }
            }
            let _ = origin_write.shutdown().await;
            client_read
        }
    };
    let responses = async move {
        let mut buffer = vec![0u8; 65536];
        // Bytes read and not yet relayed; body bytes left of the current response, how far
        // into its body the stream is, and whether its body is dropped (a replaced answer).
        let (mut pending, mut left, mut at, mut passthrough, mut dropped) = (Vec::new(), 0u64, 0u64, false, false);
        let mut fault: Option<Fault> = None;
        loop {
            let n = match origin_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buffer[..n]);
            let mut out = Vec::with_capacity(pending.len());
            loop {
                if passthrough {
                    out.append(&mut pending);
                    break;
                }
                if left > 0 {
                    if pending.is_empty() {
                        break;
                    }
                    let take = (left as usize).min(pending.len());
                    let mut piece: Vec<u8> = pending.drain(..take).collect();
                    (left, at) = (left - take as u64, at + take as u64);
                    if dropped {
                        continue;
                    }
                    let flip = shared.flip_at.load(Ordering::SeqCst);
                    let start = at - take as u64;
                    if flip >= start && flip < at {
                        piece[(flip - start) as usize] ^= 0x01;
                        shared.flipped.fetch_add(1, Ordering::SeqCst);
                    }
                    if let Some(Fault::StallAfter(n) | Fault::ResetAfter(n) | Fault::CloseAfter(n)) = fault
                        && at > n
                    {
                        piece.truncate((n - start.min(n)) as usize);
                        out.extend_from_slice(&piece);
                        let _ = client_write.write_all(&out).await;
                        let _ = cut_tx.send(());
                        return (client_write, fault.take());
                    }
                    out.extend_from_slice(&piece);
                    continue;
                }
                let Some(end) = find(&pending, b"\r\n\r\n") else { break };
                let text = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                let sent = sent_rx.recv().await.unwrap_or(Sent { head_only: false, target: "/".into(), fault: None });
                let status: u16 = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
                let length = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let no_body = sent.head_only || status < 200 || status == 204 || status == 304;
                passthrough = !no_body && text.contains("transfer-encoding: chunked");
                (left, at) = (if no_body { 0 } else { length }, 0);
                let head: Vec<u8> = pending.drain(..end + 4).collect();
                fault = sent.fault;
                dropped = false;
                match fault.as_ref().and_then(|f| replacement(f, &sent.target)) {
                    Some(answer) => {
                        out.extend_from_slice(answer.as_bytes());
                        (dropped, fault) = (true, None);
                    }
                    None => out.extend(head),
                }
            }
            if client_write.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
        (client_write, None)
    };
    let (client_read, (client_write, cut)) = tokio::join!(requests, responses);
    if let Some(fault) = cut {
        end_with(fault, client_read, client_write).await;
    }
}

/// Ends a connection whose response `fault` cut short.
async fn end_with(fault: Fault, mut client_read: OwnedReadHalf, mut client_write: OwnedWriteHalf) {
    match fault {
        Fault::StallAfter(_) => {
            // Silent until the server gives up and closes its side.
            let mut buffer = [0u8; 4096];
            while matches!(client_read.read(&mut buffer).await, Ok(n) if n > 0) {}
        }
        Fault::ResetAfter(_) => {
            // Closed with no lingering: the kernel sends RST, not FIN.
            if let Ok(stream) = client_read.reunite(client_write) {
                let _ = stream.set_zero_linger();
            }
        }
        _ => {
            let _ = client_write.shutdown().await;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
