//! A TCP proxy on 127.0.0.1 between a server and its origin that damages HTTP/1.1 responses on
//! the wire: it follows each connection's requests (their methods, no bodies) and responses
//! (status, `Content-Length`) and flips one byte of each body long enough to hold it, while
//! `flip_body_byte` is set. A chunked body is passed through untouched, and so is everything
//! after it on that connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; it stops when dropped.
pub struct FaultProxy {
    pub address: String,
    /// The body offset flipped in every response body longer than it (`u64::MAX`: none).
    flip_at: Arc<AtomicU64>,
    /// Bodies damaged so far.
    flipped: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultProxy {
    /// A proxy to `upstream` (HOST:PORT), passing everything through until told otherwise.
    pub async fn start(upstream: &str) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (flip_at, flipped) = (Arc::new(AtomicU64::new(u64::MAX)), Arc::new(AtomicU64::new(0)));
        let upstream = upstream.to_owned();
        let (at, count) = (Arc::clone(&flip_at), Arc::clone(&flipped));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, at, count) = (upstream.clone(), Arc::clone(&at), Arc::clone(&count));
                tokio::spawn(async move {
                    if let Ok(origin) = TcpStream::connect(&upstream).await {
                        relay(client, origin, at, count).await;
                    }
                });
            }
        });
        FaultProxy { address, flip_at, flipped, task }
    }

    /// Flips the byte at `offset` of every response body longer than it, from now on.
    pub fn flip_body_byte(&self, offset: u64) {
        self.flip_at.store(offset, Ordering::SeqCst);
    }

    /// Passes everything through again.
    pub fn heal(&self) {
        self.flip_at.store(u64::MAX, Ordering::SeqCst);
    }

    /// Response bodies damaged so far.
    pub fn flipped(&self) -> u64 {
        self.flipped.load(Ordering::SeqCst)
    }
}

/// Relays one connection both ways, damaging response bodies as `flip_at` says.
async fn relay(client: TcpStream, origin: TcpStream, flip_at: Arc<AtomicU64>, flipped: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut origin_read, mut origin_write) = origin.into_split();
    let (methods_tx, mut methods_rx) = tokio::sync::mpsc::unbounded_channel::<bool>();
    // Requests: each one's method (whether it is a HEAD), in order, as its head passes.
    let requests = async move {
        let (mut buffer, mut head) = ([0u8; 16384], Vec::new());
        loop {
            let n = match client_read.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            head.extend_from_slice(&buffer[..n]);
            while let Some(end) = find(&head, b"\r\n\r\n") {
                let _ = methods_tx.send(head.starts_with(b"HEAD "));
                head.drain(..end + 4);
            }
            if origin_write.write_all(&buffer[..n]).await.is_err() {
                break;
            }
        }
        let _ = origin_write.shutdown().await;
    };
    let responses = async move {
        let mut buffer = vec![0u8; 65536];
        // Bytes read and not yet relayed; body bytes left of the current response, and how far
        // into its body the stream is.
        let (mut pending, mut left, mut at, mut passthrough) = (Vec::new(), 0u64, 0u64, false);
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
                    let flip = flip_at.load(Ordering::SeqCst);
                    if flip >= at && flip < at + take as u64 {
                        piece[(flip - at) as usize] ^= 0x01;
                        flipped.fetch_add(1, Ordering::SeqCst);
                    }
                    out.extend_from_slice(&piece);
                    (left, at) = (left - take as u64, at + take as u64);
                    continue;
                }
                let Some(end) = find(&pending, b"\r\n\r\n") else { break };
                let text = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
                let head_only = methods_rx.recv().await.unwrap_or(false);
                let status: u16 = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
                let length = text
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                let no_body = head_only || status < 200 || status == 204 || status == 304;
                passthrough = !no_body && text.contains("transfer-encoding: chunked");
                (left, at) = (if no_body { 0 } else { length }, 0);
                out.extend(pending.drain(..end + 4));
            }
            if client_write.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(requests, responses);
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
