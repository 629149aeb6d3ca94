//! Helpers shared by the integration tests: the official `ztensor` venvs, builders for
//! hand-made (often hostile) `.zt` files and for test models, a plain HTTP/1.1 client, servers
//! (the binary, or `InProcess` in the test's process), the Prometheus metrics, and moto.
// Each test file uses some of these helpers, and reaches them through its private `mod common`.
#![allow(dead_code, unreachable_pub)]

pub mod corpus;
pub mod fault_proxy;
pub mod nginx;
pub mod registry;
pub mod tls;

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ztserve::config::Config;
use ztserve::format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use ztserve::format::{DType, Value};
use ztserve::server::Server;

/// Marks the test as one of the external set: it needs `what`, something beyond the built tree
/// and loopback (a venv, moto, nginx, podman, a client program). Run in the hermetic set
/// (`ZTSERVE_HERMETIC=1`, as `scripts/test` runs it), such a test fails here, naming what it
/// needs, so the two sets in `.config/nextest.toml` stay true.
pub fn external(what: &str) {
    if std::env::var_os("ZTSERVE_HERMETIC").is_some() {
        panic!("this test needs {what}: it belongs in the external set of .config/nextest.toml");
    }
}

/// Where `scripts/python-env` puts its venvs.
pub fn venv_root() -> PathBuf {
    external("the Python venvs of scripts/python-env");
    std::env::var_os("ZTSERVE_VENVS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv"))
}

/// The Python of the venv holding `ztensor==version`, made by `scripts/test`. A missing venv
/// fails the test: interop is never skipped silently.
pub fn official_python(version: &str) -> PathBuf {
    venv_python(&format!("ztensor-{version}"))
}

/// The Python of `scripts/test`'s venv `name` (`client`, `tools`, `ztensor-2.1.2`, …); a
/// missing venv fails the test.
pub fn venv_python(name: &str) -> PathBuf {
    let python = venv_root().join(name).join("bin/python");
    assert!(python.exists(), "{} is missing: run scripts/test, which makes the venv {name}", python.display());
    python
}

/// Runs `tests/interop/SCRIPT ARGS` with the Python of venv `venv`; returns its standard output.
pub fn run_interop_script(venv: &str, script: &str, args: &[&Path]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/interop").join(script);
    let output = Command::new(venv_python(venv)).arg(path).args(args).output().expect("python runs");
    assert!(
        output.status.success(),
        "{script} {args:?} in the venv {venv} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `tests/interop/official.py ARGS` under `ztensor==version` (0.1 and 1.x).
pub fn run_official(version: &str, args: &[&Path]) {
    run_script(version, "official.py", args);
}

/// Runs `tests/interop/official_v2.py ARGS` under `ztensor==version` (2.x).
pub fn run_official_v2(version: &str, args: &[&Path]) {
    run_script(version, "official_v2.py", args);
}

fn run_script(version: &str, script: &str, args: &[&Path]) {
    run_interop_script(&format!("ztensor-{version}"), script, args);
}

/// `value` in deterministic CBOR, as v2 manifests must be.
pub fn deterministic_cbor(value: &Value) -> Vec<u8> {
    ztserve::format::v2::deterministic_cbor(value)
}

pub fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

pub fn uint(n: u64) -> Value {
    Value::Integer(n.into())
}

pub fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (text(k), v)).collect())
}

pub fn cbor(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::ser::into_writer(value, &mut out).unwrap();
    out
}

/// A `ZTEN1000` file: header, `data` (which starts at offset 8), manifest bytes, size, footer.
pub fn v1_file(data: &[u8], manifest: &[u8]) -> Vec<u8> {
    let mut file = b"ZTEN1000".to_vec();
    file.extend_from_slice(data);
    file.extend_from_slice(manifest);
    file.extend_from_slice(&(manifest.len() as u64).to_le_bytes());
    file.extend_from_slice(b"ZTEN1000");
    file
}

/// A `ZTEN0001` file: header, `data`, index bytes, size.
pub fn legacy_file(data: &[u8], index: &[u8]) -> Vec<u8> {
    let mut file = b"ZTEN0001".to_vec();
    file.extend_from_slice(data);
    file.extend_from_slice(index);
    file.extend_from_slice(&(index.len() as u64).to_le_bytes());
    file
}

/// A component map with the usual fields.
pub fn component(dtype: &str, offset: u64, length: u64) -> Vec<(&'static str, Value)> {
    vec![("dtype", text(dtype)), ("offset", uint(offset)), ("length", uint(length))]
}

/// A 1.2 manifest of objects given as (name, shape, format, components).
/// An object for [`manifest`]: name, shape, format and its components' fields by role.
pub type ObjectFields<'a> = (&'a str, Vec<u64>, &'a str, Vec<(&'a str, Value)>);

pub fn manifest(objects: Vec<ObjectFields<'_>>) -> Value {
    let objects = objects
        .into_iter()
        .map(|(name, shape, format, components)| {
            (
                text(name),
                map(vec![
                    ("shape", Value::Array(shape.into_iter().map(uint).collect())),
                    ("format", text(format)),
                    ("components", map(components)),
                ]),
            )
        })
        .collect();
    map(vec![("version", text("1.2.0")), ("objects", Value::Map(objects))])
}

/// Data region of `blocks` 64-byte blocks (after the 8-byte header: 56 bytes, then 64 each),
/// so that offsets 64, 128, … are valid; filled with `fill`.
pub fn data_region(blocks: usize, fill: u8) -> Vec<u8> {
    vec![fill; 56 + 64 * blocks.saturating_sub(1)]
}

/// A running `ztserve` binary, stopped gracefully when dropped, with the address it logged.
pub struct RunningServer {
    pub child: std::process::Child,
    pub address: String,
    /// Every line the server has logged so far.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        stop_gracefully(&mut self.child);
    }
}

/// How long a stopped server may take to drain and exit before it is killed.
const STOP_WITHIN: Duration = Duration::from_secs(20);

/// Stops `child` as an operator would: SIGTERM, then waits for it to exit (draining what it
/// serves); only one still running after [`STOP_WITHIN`] is killed. Either way it is waited
/// for, so nothing a test starts outlives it.
pub fn stop_gracefully(child: &mut std::process::Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + STOP_WITHIN;
    while Instant::now() < deadline {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Starts `ztserve ARGS` (with `envs`) in the repository root and waits up to 30 s for it to
/// log its listening address. Its log is drained on a thread so it never blocks.
pub fn start_binary(args: &[&str], envs: &[(&str, &str)]) -> RunningServer {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_ztserve"))
        .args(args)
        // The binary's own default filter, which a test may replace through `envs`.
        .env_remove("RUST_LOG")
        .envs(envs.iter().copied())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (address_tx, address_rx) = std::sync::mpsc::channel();
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&log);
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // Text logs say address=IP:PORT; JSON logs say "address":"IP:PORT".
            let found = line.split("address=").nth(1).or_else(|| line.split("\"address\":\"").nth(1));
            if let Some(rest) = found {
                let address: String = rest.chars().take_while(|c| !c.is_whitespace() && *c != '"').collect();
                let _ = address_tx.send(address);
            }
            sink.lock().unwrap().push(line);
        }
    });
    let address = address_rx.recv_timeout(std::time::Duration::from_secs(30));
    let mut server = RunningServer { child, address: String::new(), log };
    server.address = address.unwrap_or_else(|_| panic!("ztserve {args:?} did not log its address within 30 s"));
    server
}

// The requests every test sends, over plain HTTP/1.1 on a new connection each: `request` (a
// GET with headers) and `request_async` (the same off the test's runtime), `send` (any method,
// a body), `head_request` (a HEAD, its head as sent), `request_status` (a GET that may find
// nothing listening yet); all but the last two give a `Reply`.

/// The status of a GET, or `None` when nothing answers (yet).
pub fn request_status(address: &str, path: &str) -> Option<u16> {
    Connection::try_open(address).ok()?.try_get(path, &[]).ok().map(|reply| reply.status)
}

/// A response read from a plain HTTP/1.1 connection: the one reply type of every test that
/// talks to a real server.
pub struct Reply {
    /// 0 when the connection closed before a whole response head.
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
    /// Whether the body ended cleanly with as many bytes as Content-Length said.
    pub complete: bool,
    /// From sending the request to the first body byte, and to the end of the body.
    pub first_byte: Duration,
    pub total: Duration,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// [`request`] off the test's runtime (on its blocking pool), for tests that run a server in
/// their own process.
pub async fn request_async(address: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let (address, path) = (address.to_owned(), path.to_owned());
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        request(&address, &path, &headers)
    })
    .await
    .unwrap()
}

/// A HEAD on a new connection: the response head as text (header names as the server sends
/// them, lowercase).
pub fn head_request(address: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(stream, "HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut head = String::new();
    stream.read_to_string(&mut head).unwrap();
    head
}

/// A GET with `headers` on a new connection (`Connection: close`), read to the end and timed
/// to its first body byte and to its end. A body cut short comes back with `complete` false.
pub fn request(address: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(address, "GET", path, headers, b"")
}

/// [`request`] with any method and a body (sent with its `Content-Length` when not empty).
pub fn send(address: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    if !body.is_empty() {
        extra.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    let started = std::time::Instant::now();
    // One write of the whole request, and its failure tolerated: a server that refuses an
    // oversized head answers and closes before reading the rest, and a write after that fails
    // however fast the machine; the answer is still there to read, and the caller checks it.
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n").into_bytes();
    request.extend_from_slice(body);
    let _ = stream.write_all(&request);
    let mut received = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    let (mut first_byte, mut head_end, mut clean_end) = (None, None, true);
    loop {
        let n = match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(_) => {
                clean_end = false;
                break;
            }
        };
        received.extend_from_slice(&buffer[..n]);
        if head_end.is_none() {
            head_end = received.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
        }
        if let (None, Some(end)) = (first_byte, head_end)
            && received.len() > end
        {
            first_byte = Some(started.elapsed());
        }
    }
    let total = started.elapsed();
    // hyper drops a head it has not flushed yet when the body fails right after its first
    // piece: the client sees the connection close with no response, another cut body.
    let Some(head_end) = head_end else {
        let first_byte = total;
        return Reply { status: 0, head: String::new(), body: received, complete: false, first_byte, total };
    };
    let head = String::from_utf8_lossy(&received[..head_end - 4]).into_owned();
    let status = head[9..12].parse().unwrap();
    let body = received[head_end..].to_vec();
    let mut reply = Reply { status, head, body, complete: false, first_byte: first_byte.unwrap_or(total), total };
    let declared: Option<usize> = reply.header("content-length").map(|v| v.parse().unwrap());
    reply.complete = clean_end && declared.is_none_or(|n| n == reply.body.len());
    reply
}

/// One keep-alive HTTP/1.1 connection; each response is read to its Content-Length.
pub struct Connection(std::io::BufReader<std::net::TcpStream>);

impl Connection {
    pub fn open(address: &str) -> Connection {
        Connection::try_open(address).unwrap()
    }

    pub fn try_open(address: &str) -> std::io::Result<Connection> {
        let stream = std::net::TcpStream::connect(address)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Connection(std::io::BufReader::new(stream)))
    }

    pub fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.try_get(path, headers).unwrap_or_else(|e| panic!("GET {path}: {e}"))
    }

    /// The response, or why the connection failed (closed early, reset, timed out).
    pub fn try_get(&mut self, path: &str, headers: &[(&str, &str)]) -> std::io::Result<Reply> {
        use std::io::{BufRead as _, Error, ErrorKind};
        let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
        write!(self.0.get_mut(), "GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n")?;
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if self.0.read_line(&mut line)? == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "connection closed in the response head"));
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let status = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "no status"))?;
        let started = std::time::Instant::now();
        let mut reply = Reply {
            status,
            head,
            body: Vec::new(),
            complete: false,
            first_byte: Duration::ZERO,
            total: Duration::ZERO,
        };
        let len: usize = reply
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "no Content-Length"))?;
        reply.body = vec![0; len];
        self.0.read_exact(&mut reply.body)?;
        reply.complete = true;
        (reply.first_byte, reply.total) = (started.elapsed(), started.elapsed());
        Ok(reply)
    }
}

/// A server in this process on 127.0.0.1:0 (its metrics are this process's), run by
/// `ztserve::server::serve` as the binary runs it, until [`InProcess::stop`] completes its
/// shutdown future.
pub struct InProcess {
    pub address: String,
    /// The S3 endpoint's address, when it is on.
    pub s3_address: Option<String>,
    pub server: Arc<Server>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl InProcess {
    /// Starts a server on `config` (with the S3 endpoint on its own listener when `with_s3`) and
    /// waits until it is ready.
    pub async fn start(config: Config, with_s3: bool) -> InProcess {
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = http.local_addr().unwrap().to_string();
        let mut config = config;
        let s3 = if with_s3 {
            let s3 = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            // The endpoint is on: tokens are kept as S3 secrets.
            config.s3_endpoint.listen = Some(s3.local_addr().unwrap());
            Some(s3)
        } else {
            None
        };
        let s3_address = s3.as_ref().map(|s3| s3.local_addr().unwrap().to_string());
        let server = Server::new(config).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        // A handle dropped without `stop` leaves the server running until the test ends.
        let shutdown = async move {
            if stopped.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let listeners = ztserve::server::Listeners { http, s3 };
        let task = tokio::spawn(ztserve::server::serve(Arc::clone(&server), listeners, shutdown));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !server.is_ready() {
            assert!(Instant::now() < deadline, "not ready within 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        InProcess { address, s3_address, server, stop, task }
    }

    /// Completes the server's shutdown future and waits for it to drain and return.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await.expect("the server's task does not panic")
    }
}

/// A server on 127.0.0.1:0 in this process, running until the test ends.
pub async fn serve(config: Config) -> (String, Arc<Server>) {
    let running = InProcess::start(config, false).await;
    (running.address, running.server)
}

/// A Hub for tests: another ztserve serving `dir` (its `/hf` API), where each `(repo, file)`
/// is written first as `dir/{repo}.safetensors`, so `org/a` is a repository of one file.
pub async fn hub_origin(dir: &std::path::Path, repos: &[(String, &[u8])]) -> (String, Arc<Server>) {
    for (repo, bytes) in repos {
        let path = dir.join(format!("{repo}.safetensors"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
    serve(Config::serving(vec![ztserve::config::SourceSpec::local(dir)])).await
}

/// [`serve`] with the S3 endpoint on its own 127.0.0.1:0 listener: the HTTP and S3 addresses.
pub async fn serve_with_s3(config: Config) -> (String, String, Arc<Server>) {
    let running = InProcess::start(config, true).await;
    (running.address, running.s3_address.unwrap(), running.server)
}

/// The sum of a Prometheus series' samples whose labels include every `labels` pair.
pub fn metric(name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = ztserve::telemetry::metrics().render();
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
        .filter(|line| labels.iter().all(|(k, v)| line.contains(&format!("{k}=\"{v}\""))))
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// Deterministic, poorly compressible bytes.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A directory for a fault test: `victim.zt` holds one u8 object `name` of `data` (zstd when
/// `zstd`), and `other.zt` holds `small`, its first 4 KiB, which must still serve once the
/// victim breaks. Returns the directory and the victim's path.
pub fn victim_and_other(name: &str, data: &[u8], zstd: bool) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.zt");
    std::fs::write(&victim, model(&[(name, DType::U8, data, zstd)])).unwrap();
    std::fs::write(dir.path().join("other.zt"), model(&[("small", DType::U8, &data[..4096], zstd)])).unwrap();
    (dir, victim)
}

/// A model of `objects`: (name, dtype, bytes, zstd).
pub fn model(objects: &[(&str, DType, &[u8], bool)]) -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    for (name, dtype, bytes, zstd) in objects {
        let count = bytes.len() as u64 / dtype.width();
        let input = ObjectInput {
            name,
            shape: &[count],
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype: *dtype, logical_type: None, bytes }],
        };
        let options = WriteOptions { zstd_level: zstd.then_some(1), digest: Some(DigestAlgorithm::Sha256) };
        w.add(&input, &options).unwrap();
    }
    w.finish(None).unwrap()
}

/// A moto S3 server on 127.0.0.1, stopped when dropped.
pub struct S3Server {
    child: Option<std::process::Child>,
    pub port: u16,
    pub endpoint: String,
    envs: Vec<(String, String)>,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts moto's S3 server from `.venv/tools` (installed by `scripts/python-env`) on a free
/// port and waits up to 30 s for it to answer. Panics, never skips, when it cannot start.
pub fn start_s3() -> S3Server {
    start_s3_with(&[])
}

/// [`start_s3`] with extra environment for moto (e.g. `INITIAL_NO_AUTH_ACTION_COUNT=0`, which
/// makes it check credentials).
pub fn start_s3_with(envs: &[(&str, &str)]) -> S3Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let envs = envs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let mut server = S3Server { child: None, port, endpoint: format!("http://127.0.0.1:{port}"), envs };
    server.start();
    server
}

impl S3Server {
    /// Starts (or starts again, empty: moto keeps nothing) the server on its port.
    pub fn start(&mut self) {
        let moto = venv_root().join("tools/bin/moto_server");
        assert!(moto.exists(), "{} is missing: run scripts/python-env (scripts/test does)", moto.display());
        let child = Command::new(moto)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "moto_server did not start within 30 s");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Stops the server and waits for it; its port refuses connections until [`S3Server::start`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_gracefully(&mut child);
        }
    }
}

impl S3Server {
    /// Creates `bucket` (moto accepts the unsigned request).
    pub fn create_bucket(&self, bucket: &str) {
        use std::io::{Read, Write};
        let address = self.endpoint.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        write!(stream, "PUT /{bucket} HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "cannot create bucket {bucket}: {response}");
    }

    /// Options reaching this server with moto's test credentials.
    pub fn options(&self) -> ztserve::storage::s3::S3Options {
        ztserve::storage::s3::S3Options {
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            allow_http: true,
            credentials: Some(("testing".into(), "testing".into())),
            ..Default::default()
        }
    }

    /// A plain object_store client for the test's own uploads.
    pub fn client(&self, bucket: &str) -> object_store::aws::AmazonS3 {
        object_store::aws::AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_region("us-east-1")
            .with_bucket_name(bucket)
            .with_allow_http(true)
            .with_access_key_id("testing")
            .with_secret_access_key("testing")
            .build()
            .unwrap()
    }
}

/// Where a test's models live: a local directory, or a prefix of a bucket on a moto S3
/// server started for the test. The HTTP contract suite runs against both.
pub enum ModelSource {
    Local(tempfile::TempDir),
    S3 { server: S3Server, client: object_store::aws::AmazonS3 },
}

/// The bucket and prefix S3 fixtures use.
pub const S3_SOURCE: &str = "s3://models/prod";

impl ModelSource {
    pub fn local() -> ModelSource {
        ModelSource::Local(tempfile::tempdir().unwrap())
    }

    pub fn s3() -> ModelSource {
        let server = start_s3();
        server.create_bucket("models");
        let client = server.client("models");
        ModelSource::S3 { server, client }
    }

    /// `local` or `s3`, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelSource::Local(_) => "local",
            ModelSource::S3 { .. } => "s3",
        }
    }

    /// The source as configured.
    pub fn name(&self) -> String {
        match self {
            ModelSource::Local(dir) => dir.path().display().to_string(),
            ModelSource::S3 { .. } => S3_SOURCE.to_owned(),
        }
    }

    /// `base` serving this source (with the S3 server's endpoint and credentials).
    pub fn config(&self, base: ztserve::config::Config) -> ztserve::config::Config {
        let source = ztserve::config::SourceSpec::try_from(self.name()).expect("a valid source");
        let mut config = base;
        config.sources.paths = vec![source];
        if let ModelSource::S3 { server, .. } = self {
            config.s3_source = ztserve::config::S3Source {
                endpoint: Some(server.endpoint.clone()),
                region: Some("us-east-1".into()),
                allow_http: true,
                access_key_id: Some("testing".into()),
                secret_access_key: Some("testing".into()),
                retries: 1,
                ..config.s3_source
            };
        }
        config
    }

    /// The same settings as `ZTSERVE_*` variables, for a server started as a process.
    pub fn envs(&self) -> Vec<(String, String)> {
        let mut envs = vec![("ZTSERVE_SOURCES__PATHS".to_owned(), self.name())];
        if let ModelSource::S3 { server, .. } = self {
            for (key, value) in [
                ("ZTSERVE_S3_SOURCE__ENDPOINT", server.endpoint.as_str()),
                ("ZTSERVE_S3_SOURCE__REGION", "us-east-1"),
                ("ZTSERVE_S3_SOURCE__ALLOW_HTTP", "true"),
                ("ZTSERVE_S3_SOURCE__ACCESS_KEY_ID", "testing"),
                ("ZTSERVE_S3_SOURCE__SECRET_ACCESS_KEY", "testing"),
                ("ZTSERVE_S3_SOURCE__RETRIES", "1"),
            ] {
                envs.push((key.to_owned(), value.to_owned()));
            }
        }
        envs
    }

    /// Writes (or atomically replaces) `key` (a path below the source, e.g. `org/a.zt`).
    pub async fn put(&self, key: &str, bytes: &[u8]) {
        match self {
            ModelSource::Local(dir) => {
                let path = dir.path().join(key);
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                let temporary = path.with_extension("partial");
                std::fs::write(&temporary, bytes).unwrap();
                std::fs::rename(&temporary, &path).unwrap();
            }
            ModelSource::S3 { client, .. } => {
                use object_store::ObjectStoreExt as _;
                let location = object_store::path::Path::from(format!("prod/{key}"));
                client.put(&location, object_store::PutPayload::from(bytes.to_vec())).await.unwrap();
            }
        }
    }

    pub async fn remove(&self, key: &str) {
        match self {
            ModelSource::Local(dir) => std::fs::remove_file(dir.path().join(key)).unwrap(),
            ModelSource::S3 { client, .. } => {
                use object_store::ObjectStoreExt as _;
                client.delete(&object_store::path::Path::from(format!("prod/{key}"))).await.unwrap();
            }
        }
    }
}

/// One tensor of a safetensors checkpoint a test writes: name, dtype, shape, bytes.
pub type StTensor<'a> = ztserve::tools::CheckpointTensor<'a>;

/// A safetensors file of `tensors`, with `__metadata__` `{"format": "pt"}` as torch writes it.
pub fn safetensors_file(tensors: &[StTensor<'_>]) -> Vec<u8> {
    ztserve::tools::safetensors_file(tensors).unwrap()
}

/// A safetensors file of one U8 tensor `w` holding `data`.
pub fn one_tensor_safetensors(data: &[u8]) -> Vec<u8> {
    safetensors_file(&[("w", safetensors::Dtype::U8, vec![data.len()], data)])
}

/// A sharded checkpoint in Hugging Face's layout, as the demo's is written: the index, then
/// `model-0000i-of-0000n.safetensors` for each of `shards`, by file name.
pub fn safetensors_checkpoint(shards: &[&[StTensor<'_>]]) -> Vec<(String, Vec<u8>)> {
    ztserve::tools::safetensors_checkpoint(shards).unwrap()
}

/// Token entries (`TOKEN [PREFIX ...]`) as the configuration holds them once loaded.
pub fn tokens(entries: Vec<String>) -> Vec<ztserve::config::TokenEntry> {
    entries.iter().map(|e| ztserve::config::TokenEntry::parse(e).expect("a valid token entry")).collect()
}

/// `POST /models/{model}/prefetch` (`model` as it goes in the path), read to its end, off the
/// test's runtime.
pub async fn prefetch(address: &str, model: &str) -> Reply {
    let (address, path) = (address.to_owned(), format!("/models/{model}/prefetch"));
    tokio::task::spawn_blocking(move || send(&address, "POST", &path, &[], b"")).await.unwrap()
}

/// The last JSON line of a streamed (chunked) body.
pub fn last_line(body: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(body);
    let line = text.lines().rfind(|l| l.starts_with('{')).expect("a JSON line");
    serde_json::from_str(line).unwrap()
}

/// A tmpfs of `bytes` mounted on a new directory, unmounted when dropped.
pub struct SmallDisk {
    pub dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(bytes: u64) -> SmallDisk {
        external("root, to mount a tmpfs");
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount runs");
        assert!(status.success(), "cannot mount a tmpfs (the test suite runs as root, as scripts/test needs)");
        SmallDisk { dir }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazily: a file the server still holds open does not keep the mount.
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Row-major f32 values `first, first + 1, …` of `shape`, as bytes.
pub fn counting_f32(shape: &[u64], first: u64) -> Vec<u8> {
    let count: u64 = shape.iter().product();
    (0..count).flat_map(|i| ((first + i) as f32).to_le_bytes()).collect()
}

/// A 1.x model of dense f32 objects (name, shape, zstd), with SHA-256 digests: object `i`
/// holds [`counting_f32`] from `i * step`.
pub fn dense_f32_model(step: u64, objects: &[(&str, &[u64], bool)]) -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    for (i, (name, shape, zstd)) in objects.iter().enumerate() {
        let bytes = counting_f32(shape, step * i as u64);
        let input = ObjectInput {
            name,
            shape,
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype: DType::F32, logical_type: None, bytes: &bytes }],
        };
        let options = WriteOptions { zstd_level: zstd.then_some(1), digest: Some(DigestAlgorithm::Sha256) };
        w.add(&input, &options).unwrap();
    }
    w.finish(None).unwrap()
}
