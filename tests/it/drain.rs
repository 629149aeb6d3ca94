//! Shutdown under load: SIGTERM reaches a server with 64 connections in flight, a client that
//! stopped reading and cache fills stalled at their origin. Readiness turns 503 at once, new
//! connections are refused, every response is exact or cut short (never wrong), the process
//! exits when the drain time runs out, and nothing half-written is left behind.

use crate::common;

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::fault_proxy::{Fault, FaultProxy};
use common::{hub_origin, noise, one_tensor_safetensors, request_async, start_binary};
use ztserve::config::{Config, SourceSpec};

/// Seconds the victim gives requests in flight once told to stop.
const DRAIN_SECS: u64 = 5;

/// What one client read of a body: how many bytes, whether each was the expected one, and
/// whether the body ended with all of them.
struct Received {
    len: usize,
    exact: bool,
    complete: bool,
}

/// A GET of `path` on a new connection, its body checked against `expected` as it comes: it
/// reads the head and the first 64 KiB, says so on `started`, waits for `go`, then reads the
/// rest.
fn slow_client(
    address: String,
    path: String,
    expected: Arc<Vec<u8>>,
    started: std::sync::mpsc::Sender<()>,
    go: Arc<AtomicBool>,
) -> Received {
    let mut stream = std::net::TcpStream::connect(&address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let (mut head, mut buffer) = (Vec::new(), vec![0u8; 65536]);
    let (mut len, mut exact, mut length, mut told) = (0usize, true, None::<usize>, false);
    loop {
        if told && !go.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let n = match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut piece = &buffer[..n];
        if length.is_none() {
            head.extend_from_slice(piece);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            assert!(text.starts_with("http/1.1 200"), "{text}");
            let declared = text.lines().find_map(|l| l.strip_prefix("content-length:")).unwrap();
            length = Some(declared.trim().parse().unwrap());
            let body_start = end + 4 - (head.len() - n);
            piece = &buffer[body_start..n];
        }
        exact &= len + piece.len() <= expected.len() && expected[len..len + piece.len()] == *piece;
        len += piece.len();
        if !told && len > 65536 {
            let _ = started.send(());
            told = true;
        }
    }
    if !told {
        let _ = started.send(());
    }
    Received { len, exact, complete: Some(len) == length }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_with_64_connections_and_stalled_fills_drains_in_time_and_leaves_nothing_half_written() {
    let work = tempfile::tempdir().unwrap();
    let (origin_dir, local, cache) = (work.path().join("origin"), work.path().join("local"), work.path().join("cache"));
    std::fs::create_dir_all(local.join("team")).unwrap();
    let hub =
        [("org/a", one_tensor_safetensors(&noise(4 << 20, 1))), ("org/b", one_tensor_safetensors(&noise(4 << 20, 2)))];
    // Larger than what the sockets' buffers hold: the stalled client holds the drain open.
    let big = Arc::new(one_tensor_safetensors(&noise(32 << 20, 3)));
    std::fs::write(local.join("team/big.safetensors"), big.as_slice()).unwrap();
    let repos: Vec<_> = hub.iter().map(|(repo, bytes)| (repo.to_string(), bytes.as_slice())).collect();
    let (origin, _origin_server) = hub_origin(&origin_dir, &repos).await;
    let proxy = FaultProxy::start(&origin).await;

    let endpoint = format!("http://{}/hf", proxy.address);
    let drain = DRAIN_SECS.to_string();
    let args = ["serve", "--listen", "127.0.0.1:0", "--source", "hf://org/a", "--source", "hf://org/b"];
    let (local_arg, cache_arg) = (local.to_str().unwrap(), cache.to_str().unwrap());
    let args: Vec<&str> = args.into_iter().chain(["--source", local_arg, "--cache-dir", cache_arg]).collect();
    let envs = [
        ("HF_ENDPOINT", endpoint.as_str()),
        ("ZTSERVE_SERVER__SHUTDOWN_DRAIN_SECS", drain.as_str()),
        // A stalled origin outlasts the drain.
        ("ZTSERVE_HUB_SOURCE__READ_TIMEOUT_SECS", "600"),
        ("ZTSERVE_CACHE__BLOCK_BYTES", "65536"),
    ];
    let mut victim = start_binary(&args, &envs);
    let address = victim.address.clone();
    assert_eq!(request_async(&address, "/readyz", &[]).await.status, 200);

    // Both Hub files' fills stall at their origin after 256 KiB.
    proxy.inject(Fault::StallAfter(256 << 10));
    proxy.inject(Fault::StallAfter(256 << 10));
    let fills: Vec<_> = ["org%2Fa", "org%2Fb"]
        .into_iter()
        .map(|model| {
            let address = address.clone();
            tokio::spawn(async move { request_async(&address, &format!("/models/{model}/file"), &[]).await })
        })
        .collect();
    // 61 readers of the local file, each in flight; one more that never reads.
    let (started_tx, started) = std::sync::mpsc::channel();
    let go = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..61)
        .map(|_| {
            let (address, started, go, big) = (address.clone(), started_tx.clone(), Arc::clone(&go), Arc::clone(&big));
            std::thread::spawn(move || slow_client(address, "/models/team%2Fbig/file".into(), big, started, go))
        })
        .collect();
    let mut stalled = std::net::TcpStream::connect(&address).unwrap();
    write!(stalled, "GET /models/team%2Fbig/file HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    for _ in 0..readers.len() {
        started.recv_timeout(Duration::from_secs(60)).expect("a reader never started");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while proxy.faults_left() > 0 {
        assert!(Instant::now() < deadline, "the fills never reached their origin");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let stop = Instant::now();
    rustix::process::kill_process(rustix::process::Pid::from_child(&victim.child), rustix::process::Signal::TERM)
        .unwrap();
    // New connections are refused from the moment the signal is handled, while the stalled
    // client still holds the process in its drain.
    loop {
        match std::net::TcpStream::connect(&address) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            // A connection still in the closing listener's backlog is reset, not refused: the
            // next one meets no listener.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => continue,
            Err(e) => panic!("{e}"),
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
    assert!(victim.child.try_wait().unwrap().is_none(), "exited before its drain time ran out");
    go.store(true, Ordering::SeqCst);
    let exit = tokio::task::spawn_blocking(move || {
        let status = victim.child.wait().unwrap();
        (status, victim)
    });
    let (status, victim) = exit.await.unwrap();
    let took = stop.elapsed();
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    // The stalled client and the stalled fills hold it to the drain time, and no longer.
    assert!(took >= Duration::from_secs(DRAIN_SECS), "exited after {took:?}, before the drain time");
    assert!(took < Duration::from_secs(DRAIN_SECS + 15), "exited after {took:?}");
    drop(stalled);
    let log = victim.log.lock().unwrap().join("\n");
    assert!(log.contains("drain time ran out"), "{log}");

    // Every reader got exact bytes, whole or cut short.
    let mut whole = 0;
    for reader in readers {
        let received = reader.join().unwrap();
        assert!(received.exact, "wrong bytes at or before {}", received.len);
        whole += usize::from(received.complete);
    }
    for fill in fills {
        let reply = fill.await.unwrap();
        assert!(!reply.complete || reply.status != 200, "a stalled fill answered whole: {}", reply.head);
    }
    eprintln!("{whole} of 61 readers finished within the drain");

    // Nothing half-written: no temporary, and after a restart every body is exact.
    let left: Vec<_> = std::fs::read_dir(cache.join("tmp")).unwrap().collect();
    assert!(left.is_empty(), "temporaries left: {left:?}");
    proxy.heal();
    let restarted = start_binary(&args, &envs);
    for (model, bytes) in [("org%2Fa", &hub[0].1), ("org%2Fb", &hub[1].1), ("team%2Fbig", big.as_ref())] {
        let reply = request_async(&restarted.address, &format!("/models/{model}/file"), &[]).await;
        assert!(reply.complete && reply.body == *bytes, "{model} after the restart: {}", reply.head);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_turns_503_draining_the_moment_shutdown_begins() {
    use tower::ServiceExt as _;
    let models = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(models.path().join("team")).unwrap();
    let big = Arc::new(one_tensor_safetensors(&noise(32 << 20, 5)));
    std::fs::write(models.path().join("team/big.safetensors"), big.as_slice()).unwrap();
    let mut config = Config::serving(vec![SourceSpec::local(models.path())]);
    config.server.shutdown_drain_secs = 30;
    let running = common::InProcess::start(config, false).await;
    let (address, server) = (running.address.clone(), Arc::clone(&running.server));
    let readyz = || async {
        let request = axum::http::Request::get("/readyz").body(axum::body::Body::empty()).unwrap();
        server.http_app().oneshot(request).await.unwrap().status()
    };
    assert_eq!(readyz().await, 200);
    // A response in flight holds the drain open.
    let (started_tx, started) = std::sync::mpsc::channel();
    let go = Arc::new(AtomicBool::new(false));
    let reader = {
        let (go, big) = (Arc::clone(&go), Arc::clone(&big));
        std::thread::spawn(move || slow_client(address, "/models/team%2Fbig/file".into(), big, started_tx, go))
    };
    started.recv_timeout(Duration::from_secs(60)).unwrap();
    let stopping = tokio::spawn(running.stop());
    let deadline = Instant::now() + Duration::from_secs(30);
    while readyz().await != 503 {
        assert!(Instant::now() < deadline, "readiness never turned 503");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!stopping.is_finished(), "the drain waits for the response in flight");
    go.store(true, Ordering::SeqCst);
    let received = tokio::task::spawn_blocking(move || reader.join().unwrap()).await.unwrap();
    assert!(received.complete && received.exact, "the response in flight finished whole");
    stopping.await.unwrap().unwrap();
}
