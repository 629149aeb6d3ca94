//! Load and faults against the real binary. 64 keep-alive connections send a mixed load for
//! `ZTSERVE_LOAD_SECONDS` (15 in the test suite, 60 with `scripts/load`): manifests, full
//! GETs, ranges, zstd components, the model list, hostile models and an S3 model. Every
//! answer is checked byte for byte. Meanwhile, on a timeline: a model is atomically replaced
//! (clients must see the old or the new bytes, never a mix, each under its own ETag), a
//! mapped file is truncated in place (the process must stay up and answer errors for that
//! model only), and the S3 server is stopped and started again (its models answer 503, then
//! recover without a restart). It fails on any unexpected answer, and unless the server's
//! anonymous memory stays flat after warm-up. Then SIGTERM must stop it cleanly.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Connection, ModelSource, Reply, model, noise};
use ztserve::format::DType;

const MIB: usize = 1 << 20;
const CONNECTIONS: usize = 64;
/// Hostile files served beside the good ones.
const HOSTILE: usize = 32;

fn seconds() -> u64 {
    std::env::var("ZTSERVE_LOAD_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15)
}

/// Compressible bytes, so a zstd component really is compressed.
fn compressible(len: usize, seed: u64) -> Vec<u8> {
    let noise = noise(len / 16 + 1, seed);
    (0..len).map(|i| noise[i / 16] & 0x0f).collect()
}

/// What the faults have done so far, as workers see it.
#[derive(Default)]
struct Phase {
    replaced: AtomicBool,
    truncated: AtomicBool,
    /// From the S3 server's stop until the server serves the re-uploaded S3 model again.
    s3_down: AtomicBool,
}

/// Tallies by request kind: answers as expected, answers that a fault explains, errors.
#[derive(Default)]
struct Tally {
    counts: BTreeMap<&'static str, [u64; 3]>,
    errors: Vec<String>,
}

enum Outcome {
    Ok,
    /// As expected, on a connection that is now closed (a body ended short on purpose).
    OkClosed,
    /// An error answer the current faults explain (503 while S3 is down, a truncated model).
    Fault,
    Error(String),
}

/// The expected bodies.
struct Fixture {
    raw: Vec<u8>,
    packed: Vec<u8>,
    version_a: Vec<u8>,
    version_b: Vec<u8>,
    victim: Vec<u8>,
    remote_raw: Vec<u8>,
    remote_packed: Vec<u8>,
}

/// Random numbers for one worker (xorshift: deterministic per worker, no dependency).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn range_of(rng: &mut Rng, len: usize) -> (usize, usize) {
    let size = 1 + rng.below(MIB as u64) as usize;
    let start = rng.below((len - size) as u64) as usize;
    (start, start + size)
}

fn exact(reply: &Reply, status: u16, expected: &[u8]) -> Outcome {
    if reply.status != status {
        return Outcome::Error(format!(
            "status {} (expected {status}): {}",
            reply.status,
            String::from_utf8_lossy(&reply.body[..reply.body.len().min(200)])
        ));
    }
    if reply.body != expected {
        return Outcome::Error(format!("{} bytes differ from the expected {}", reply.body.len(), expected.len()));
    }
    Outcome::Ok
}

/// Whether the body's SHA-256 is the one its `Repr-Digest` header declares.
fn repr_digest_matches(reply: &Reply) -> bool {
    use base64::Engine as _;
    use sha2::Digest as _;
    let declared =
        reply.header("repr-digest").and_then(|v| v.strip_prefix("sha-256=:")?.strip_suffix(':').map(str::to_owned));
    let actual = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(&reply.body));
    declared.is_some_and(|declared| declared == actual)
}

fn error_code(reply: &Reply) -> String {
    serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// One request of the mix; `None` from the connection means it failed (closed, reset).
fn one_request(
    kind: u64,
    rng: &mut Rng,
    connection: &mut Connection,
    fixture: &Fixture,
    phase: &Phase,
    etags: &Mutex<HashMap<String, bool>>,
) -> (&'static str, Outcome) {
    let get = |connection: &mut Connection, path: &str, headers: &[(&str, &str)]| connection.try_get(path, headers);
    match kind {
        0 => (
            "manifest",
            match get(connection, "/models/dense", &[]) {
                Ok(reply) if reply.status == 200 && reply.json()["id"] == "dense" => Outcome::Ok,
                Ok(reply) => Outcome::Error(format!("manifest answered {}", reply.status)),
                Err(e) => Outcome::Error(e.to_string()),
            },
        ),
        1 => (
            "full raw",
            match get(connection, "/models/dense/objects/w", &[]) {
                Ok(reply) => exact(&reply, 200, &fixture.raw),
                Err(e) => Outcome::Error(e.to_string()),
            },
        ),
        2 | 3 => {
            let (start, end) = range_of(rng, fixture.raw.len());
            let range = format!("bytes={start}-{}", end - 1);
            (
                "range raw",
                match get(connection, "/models/dense/objects/w", &[("Range", &range)]) {
                    Ok(reply) => exact(&reply, 206, &fixture.raw[start..end]),
                    Err(e) => Outcome::Error(e.to_string()),
                },
            )
        }
        4 => (
            "full zstd",
            match get(connection, "/models/packed/objects/z", &[]) {
                Ok(reply) => exact(&reply, 200, &fixture.packed),
                Err(e) => Outcome::Error(e.to_string()),
            },
        ),
        5 => {
            let (start, end) = range_of(rng, fixture.packed.len());
            let range = format!("bytes={start}-{}", end - 1);
            (
                "range zstd",
                match get(connection, "/models/packed/objects/z", &[("Range", &range)]) {
                    Ok(reply) => exact(&reply, 206, &fixture.packed[start..end]),
                    Err(e) => Outcome::Error(e.to_string()),
                },
            )
        }
        6 => (
            "list",
            match get(connection, "/models", &[]) {
                Ok(reply) if reply.status == 200 => {
                    let list = reply.json();
                    let dense_ok = list["models"]
                        .as_array()
                        .is_some_and(|m| m.iter().any(|m| m["id"] == "dense" && m["status"] == "ok"));
                    if dense_ok { Outcome::Ok } else { Outcome::Error("dense is not listed ok".into()) }
                }
                Ok(reply) => Outcome::Error(format!("list answered {}", reply.status)),
                Err(e) => Outcome::Error(e.to_string()),
            },
        ),
        7 => {
            let replaced = phase.replaced.load(Ordering::SeqCst);
            (
                "replaced",
                match get(connection, "/models/replace/objects/w", &[]) {
                    Ok(reply) if reply.status == 200 => {
                        let is_b = if reply.body == fixture.version_a {
                            false
                        } else if reply.body == fixture.version_b {
                            true
                        } else {
                            return ("replaced", Outcome::Error("a body that is neither version (a mix)".into()));
                        };
                        if is_b && !replaced {
                            return ("replaced", Outcome::Error("the new version before the replacement".into()));
                        }
                        let etag = reply.header("etag").unwrap_or_default().to_owned();
                        match etags.lock().unwrap().insert(etag.clone(), is_b) {
                            Some(before) if before != is_b => {
                                Outcome::Error(format!("ETag {etag} served both versions"))
                            }
                            _ => Outcome::Ok,
                        }
                    }
                    // Between the rename and the rescan the old mapping still serves: nothing else
                    // is expected.
                    Ok(reply) => Outcome::Error(format!("replaced model answered {}", reply.status)),
                    Err(e) => Outcome::Error(e.to_string()),
                },
            )
        }
        8 => {
            let reply = get(connection, "/models/victim/objects/w", &[]);
            // Read after the answer: a request under way when the file was cut may see it.
            let truncated = phase.truncated.load(Ordering::SeqCst);
            (
                "truncated",
                match reply {
                    Ok(reply) if reply.status == 200 && reply.body == fixture.victim => Outcome::Ok,
                    Ok(reply) if truncated && matches!(reply.status, 422 | 503) => Outcome::Fault,
                    // Queued in kernel buffers before the truncation, sent by sendfile from pages
                    // the truncation zeroed: complete but altered, and its Repr-Digest says so
                    // (README "Storage": files must be replaced by rename, not cut in place).
                    Ok(reply) if truncated && reply.status == 200 && !repr_digest_matches(&reply) => Outcome::Fault,
                    Ok(reply) => {
                        Outcome::Error(format!("victim answered {} with {} bytes", reply.status, reply.body.len()))
                    }
                    // A response cut short by the truncation: the client sees it is incomplete.
                    Err(_) if truncated => Outcome::Fault,
                    Err(e) => Outcome::Error(e.to_string()),
                },
            )
        }
        9 => {
            let n = rng.below(HOSTILE as u64);
            let path = if rng.below(2) == 0 {
                format!("/models/hostile%2F{n:02}")
            } else {
                format!("/models/hostile%2F{n:02}/objects/w")
            };
            (
                "hostile",
                match get(connection, &path, &[]) {
                    Ok(reply) if reply.status < 500 => Outcome::Ok,
                    Ok(reply) => Outcome::Error(format!("{path} answered {}: {}", reply.status, error_code(&reply))),
                    // A mutated digest or zstd frame found mid-body ends it short, by design.
                    Err(_) => Outcome::OkClosed,
                },
            )
        }
        _ => {
            let (path, body) = if rng.below(2) == 0 {
                ("/models/remote%2Fmodel/objects/w", &fixture.remote_raw)
            } else {
                ("/models/remote%2Fmodel/objects/z", &fixture.remote_packed)
            };
            let (start, end) = range_of(rng, body.len());
            let range = format!("bytes={start}-{}", end - 1);
            // A request that began or ended inside the outage may rightly fail.
            let down_before = phase.s3_down.load(Ordering::SeqCst);
            let reply = get(connection, path, &[("Range", &range)]);
            let down = down_before || phase.s3_down.load(Ordering::SeqCst);
            (
                "s3 range",
                match reply {
                    // 503 while the store is unreachable; 404 once a rescan has listed the
                    // restarted store's bucket before the model was uploaded to it again.
                    Ok(reply) if down && (reply.status == 503 || error_code(&reply) == "model_not_found") => {
                        Outcome::Fault
                    }
                    Ok(reply) => exact(&reply, 206, &body[start..end]),
                    Err(_) if down => Outcome::Fault,
                    Err(e) => Outcome::Error(e.to_string()),
                },
            )
        }
    }
}

struct StopOnDrop(std::process::Child);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        common::stop_gracefully(&mut self.0);
    }
}

/// The server's anonymous resident memory (mapped model files excluded), in MiB.
fn rss_anon_mib(pid: u32) -> f64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Hostile variants of a valid file: every structural failure, then seeded random mutations.
fn hostile_files(valid: &[u8]) -> Vec<Vec<u8>> {
    let len = valid.len();
    let mut files = vec![
        Vec::new(),
        valid[..8].to_vec(),
        valid[..len / 2].to_vec(),
        valid[..len - 1].to_vec(),
        [b"ZTEN9999".as_slice(), &valid[8..]].concat(),
        [&valid[..len - 8], b"ZTEN9999".as_slice()].concat(),
        [&valid[..len - 16], &0u64.to_le_bytes(), b"ZTEN1000"].concat(),
        [&valid[..len - 16], &u64::MAX.to_le_bytes(), b"ZTEN1000"].concat(),
        [&valid[..len - 16], &(len as u64).to_le_bytes(), b"ZTEN1000"].concat(),
        {
            let mut garbage = valid.to_vec();
            let manifest_len = u64::from_le_bytes(valid[len - 16..len - 8].try_into().unwrap()) as usize;
            garbage[len - 16 - manifest_len..len - 16].fill(0xff);
            garbage
        },
        [b"ZTEN0002".as_slice(), &valid[8..]].concat(),
    ];
    let mut rng = Rng(0x5eed);
    while files.len() < HOSTILE {
        let mut mutated = valid.to_vec();
        for _ in 0..1 + rng.below(8) {
            let at = rng.below(len as u64) as usize;
            mutated[at] ^= 1 << rng.below(8);
        }
        files.push(mutated);
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_load_with_replacement_truncation_and_an_s3_outage_loses_nothing_and_memory_stays_flat() {
    let seconds = seconds();
    let fixture = Arc::new(Fixture {
        raw: noise(8 * MIB, 1),
        packed: compressible(8 * MIB, 2),
        version_a: noise(4 * MIB, 3),
        version_b: noise(4 * MIB, 4),
        victim: noise(4 * MIB, 5),
        remote_raw: noise(4 * MIB, 6),
        remote_packed: compressible(4 * MIB, 7),
    });
    let local = tempfile::tempdir().unwrap();
    let dir = local.path();
    let write = |name: &str, bytes: Vec<u8>| {
        let path = dir.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, bytes).unwrap();
    };
    write(
        "dense.zt",
        model(&[("w", DType::U8, &fixture.raw, false), ("small", DType::U8, &fixture.raw[..1000], false)]),
    );
    write("packed.zt", model(&[("z", DType::U8, &fixture.packed, true)]));
    write("replace.zt", model(&[("w", DType::U8, &fixture.version_a, false)]));
    write("victim.zt", model(&[("w", DType::U8, &fixture.victim, false)]));
    let valid = model(&[
        ("w", DType::U8, &fixture.raw[..64 << 10], false),
        ("z", DType::U8, &fixture.packed[..64 << 10], true),
    ]);
    for (n, file) in hostile_files(&valid).into_iter().enumerate() {
        write(&format!("hostile/{n:02}.zt"), file);
    }
    let remote_model =
        model(&[("w", DType::U8, &fixture.remote_raw, false), ("z", DType::U8, &fixture.remote_packed, true)]);
    let mut s3 = ModelSource::s3();
    s3.put("remote/model/model.zt", &remote_model).await;

    let mut envs: Vec<(String, String)> =
        s3.envs().into_iter().filter(|(k, _)| k != "ZTSERVE_SOURCES__PATHS").collect();
    envs.push(("ZTSERVE_SOURCES__PATHS".into(), format!("{},{}", dir.display(), common::S3_SOURCE)));
    envs.push(("ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS".into(), "1".into()));
    envs.push(("ZTSERVE_S3_SOURCE__CONNECT_TIMEOUT_SECS".into(), "1".into()));
    envs.push(("ZTSERVE_S3_SOURCE__READ_TIMEOUT_SECS".into(), "5".into()));
    // Warnings and errors only: a log line per request would cost more than the request.
    envs.push(("RUST_LOG".into(), "warn".into()));
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let mut server = StopOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_ztserve"))
            .args(["serve", "--listen", &address])
            .envs(envs)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = server.0.id();
    let ready = Instant::now();
    while common::request_status(&address, "/readyz") != Some(200) {
        assert!(ready.elapsed() < Duration::from_secs(30), "not ready within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }

    let phase = Arc::new(Phase::default());
    let tally = Arc::new(Mutex::new(Tally::default()));
    let etags = Arc::new(Mutex::new(HashMap::new()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|worker| {
            let (address, fixture, phase, tally, etags) =
                (address.clone(), Arc::clone(&fixture), Arc::clone(&phase), Arc::clone(&tally), Arc::clone(&etags));
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((worker as u64 + 1) * 0x1000_0001));
                let mut connection = None;
                while Instant::now() < deadline {
                    let conn = match &mut connection {
                        Some(conn) => conn,
                        None => match Connection::try_open(&address) {
                            Ok(conn) => connection.insert(conn),
                            Err(e) => {
                                let mut tally = tally.lock().unwrap();
                                tally.errors.push(format!("connect: {e}"));
                                tally.counts.entry("connect").or_default()[2] += 1;
                                std::thread::sleep(Duration::from_millis(100));
                                continue;
                            }
                        },
                    };
                    let kind = rng.below(11);
                    let (name, outcome) = one_request(kind, &mut rng, conn, &fixture, &phase, &etags);
                    let mut tally = tally.lock().unwrap();
                    let slot = tally.counts.entry(name).or_default();
                    match outcome {
                        Outcome::Ok => slot[0] += 1,
                        Outcome::OkClosed => {
                            slot[0] += 1;
                            connection = None;
                        }
                        Outcome::Fault => {
                            slot[1] += 1;
                            connection = None; // it may be the one a short body ended
                        }
                        Outcome::Error(message) => {
                            slot[2] += 1;
                            if tally.errors.len() < 20 {
                                tally
                                    .errors
                                    .push(format!("{:.1} s: {name}: {message}", started.elapsed().as_secs_f64()));
                            }
                            connection = None;
                        }
                    }
                }
            })
        })
        .collect();

    // The timeline, sampling memory all along.
    let at = |fraction: f64| started + Duration::from_secs_f64(seconds as f64 * fraction);
    let mut samples: Vec<(f64, f64)> = Vec::new();
    let mut steps: Vec<(f64, &str)> =
        vec![(0.25, "replace"), (0.40, "truncate"), (0.50, "stop s3"), (0.65, "start s3")];
    while Instant::now() < deadline {
        let now = started.elapsed().as_secs_f64() / seconds as f64;
        samples.push((now, rss_anon_mib(pid)));
        while let Some(&(when, step)) = steps.first() {
            if Instant::now() < at(when) {
                break;
            }
            steps.remove(0);
            match step {
                "replace" => {
                    let next = dir.join("replace.zt.new");
                    fs::write(&next, model(&[("w", DType::U8, &fixture.version_b, false)])).unwrap();
                    phase.replaced.store(true, Ordering::SeqCst);
                    fs::rename(&next, dir.join("replace.zt")).unwrap();
                }
                "truncate" => {
                    phase.truncated.store(true, Ordering::SeqCst);
                    fs::OpenOptions::new()
                        .write(true)
                        .open(dir.join("victim.zt"))
                        .unwrap()
                        .set_len(MIB as u64)
                        .unwrap();
                }
                "stop s3" => {
                    eprintln!("{:.1} s: stopping S3", started.elapsed().as_secs_f64());
                    phase.s3_down.store(true, Ordering::SeqCst);
                    let ModelSource::S3 { server, .. } = &mut s3 else { unreachable!() };
                    server.stop();
                }
                _ => {
                    let ModelSource::S3 { server, .. } = &mut s3 else { unreachable!() };
                    eprintln!("{:.1} s: starting S3", started.elapsed().as_secs_f64());
                    server.start();
                    server.create_bucket("models");
                    s3.put("remote/model/model.zt", &remote_model).await;
                    // The outage ends when the server serves the model again (after its next
                    // rescan), however long that takes on this machine; the bound only turns
                    // a server that never recovers into a failure instead of a hang.
                    let (address, expected) = (address.clone(), fixture.remote_raw.clone());
                    let recovered = tokio::task::spawn_blocking(move || {
                        let since = Instant::now();
                        while since.elapsed() < Duration::from_secs(120) {
                            let reply = common::request(&address, "/models/remote%2Fmodel/objects/w", &[]);
                            if reply.status == 200 && reply.body == expected {
                                return true;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        false
                    })
                    .await
                    .unwrap();
                    assert!(recovered, "the S3 model was not served again within 120 s of its re-upload");
                    phase.s3_down.store(false, Ordering::SeqCst);
                    eprintln!("{:.1} s: S3 is back", started.elapsed().as_secs_f64());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::task::spawn_blocking(move || workers.into_iter().for_each(|w| w.join().unwrap())).await.unwrap();

    // After the faults: every model is where it should be, and the process lives.
    let check = |path: &str| common::request(&address, path, &[]);
    assert_eq!(check("/healthz").status, 200, "the server died");
    let replaced = check("/models/replace/objects/w");
    assert!(replaced.status == 200 && replaced.body == fixture.version_b, "the replacement is not served");
    let victim = check("/models/victim/objects/w");
    assert!(matches!(victim.status, 422 | 503), "the truncated model answered {}", victim.status);
    let remote = check("/models/remote%2Fmodel/objects/w");
    assert!(remote.status == 200 && remote.body == fixture.remote_raw, "S3 did not recover: {}", remote.status);
    let listed = check("/models").json();
    let status =
        |id: &str| listed["models"].as_array().unwrap().iter().find(|m| m["id"] == id).map(|m| m["status"].clone());
    assert_eq!(status("dense"), Some("ok".into()));
    let broken = (0..HOSTILE).filter(|n| status(&format!("hostile/{n:02}")) == Some("broken".into())).count();

    // Memory: after warm-up (the first 30%), the peak of the last 30% must stay near it.
    let window = |from: f64, to: f64| {
        samples.iter().filter(|(t, _)| (from..to).contains(t)).map(|(_, m)| *m).fold(0.0, f64::max)
    };
    let (warm, late) = (window(0.2, 0.3), window(0.7, 1.01));
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    let mut report =
        format!("{seconds} s at {CONNECTIONS} connections; hostile models listed broken: {broken} of {HOSTILE}\n");
    writeln!(report, "{:<12} {:>8} {:>8} {:>8}", "kind", "ok", "fault", "error").unwrap();
    let mut total = [0u64; 3];
    for (kind, [ok, fault, error]) in &tally.counts {
        writeln!(report, "{kind:<12} {ok:>8} {fault:>8} {error:>8}").unwrap();
        total = [total[0] + ok, total[1] + fault, total[2] + error];
    }
    writeln!(report, "{:<12} {:>8} {:>8} {:>8}", "total", total[0], total[1], total[2]).unwrap();
    writeln!(report, "server anonymous RSS: {warm:.0} MiB after warm-up, {late:.0} MiB peak at the end").unwrap();
    println!("{report}");
    assert!(tally.errors.is_empty(), "{report}errors:\n{}", tally.errors.join("\n"));
    assert!(total[0] > 100, "{report}too few requests to mean anything");
    assert!(broken >= 10, "{report}the structurally broken files are not all listed broken");
    assert!(late <= warm * 1.25 + 32.0, "{report}memory grew under steady load");

    // SIGTERM under a clean state: a successful exit.
    assert!(std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let stop = Instant::now();
    let exit = loop {
        if let Some(status) = server.0.try_wait().unwrap() {
            break status;
        }
        assert!(stop.elapsed() < Duration::from_secs(30), "still running 30 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "exit after SIGTERM: {exit:?}");
}
