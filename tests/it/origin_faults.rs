//! Faults between ztserve and its origin, injected by a proxy of the tests' own
//! (`common::fault_proxy`) in front of a Hub (another ztserve's `/hf`). Bytes damaged on the
//! wire are checked against the file's LFS SHA-256 before anything is kept or completed, so a
//! client sees an error or a body cut short, never wrong bytes whole; nothing damaged is kept,
//! the fill is tried once more, and a failure is not remembered: once the wire heals, the next
//! read serves the file. Error answers are retried a bounded number of times; stalls, resets
//! and short bodies end the read; a redirect elsewhere is followed without the token; the
//! other models keep serving throughout.

use crate::common;

use std::path::Path;

use common::fault_proxy::{Fault, FaultProxy};
use common::{hub_origin, metric, noise, one_tensor_safetensors, request_async, serve};
use ztserve::config::{Config, SourceSpec};

fn blocks_in(cache: &Path) -> usize {
    std::fs::read_dir(cache.join("blocks")).map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_damaged_on_the_wire_are_never_kept_or_served_and_the_next_read_tries_again() {
    let work = tempfile::tempdir().unwrap();
    let (origin_dir, cache) = (work.path().join("origin"), work.path().join("cache"));
    let (a, b) = (one_tensor_safetensors(&noise(1 << 20, 3)), one_tensor_safetensors(&noise(1 << 20, 4)));
    let (origin, _origin_server) = hub_origin(&origin_dir, &[("org/a".into(), &a), ("org/b".into(), &b)]).await;
    let proxy = FaultProxy::start(&origin).await;

    let mut config = Config::serving(vec![
        SourceSpec::Hub { repo: "org/a".into(), revision: None },
        SourceSpec::Hub { repo: "org/b".into(), revision: None },
    ]);
    config.hub_source.endpoint = Some(format!("http://{}/hf", proxy.address));
    config.cache.dir = Some(cache.clone());
    config.cache.block_bytes = 64 << 10;
    let (address, _server) = serve(config).await;
    let (a_file, b_file) = ("/models/org%2Fa/file", "/models/org%2Fb/file");

    // The wire damages one byte of every body past 300 KiB: the file never arrives whole.
    let mismatches = metric("ztserve_disk_cache_checked_fills_total", &[("outcome", "mismatch")]);
    proxy.flip_body_byte(300 << 10);
    let held = blocks_in(&cache);
    let reply = request_async(&address, a_file, &[]).await;
    // Bytes stream as they are hashed, the last held back: the body is cut short of its length.
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(!reply.complete && reply.body.len() < a.len(), "a damaged file was sent whole");
    assert_eq!(
        metric("ztserve_disk_cache_checked_fills_total", &[("outcome", "mismatch")]),
        mismatches + 2.0,
        "tried twice"
    );
    assert!(proxy.flipped() >= 2);
    assert_eq!(blocks_in(&cache), held, "nothing damaged was kept");
    // The other model still serves (its blocks are checked as they come).
    proxy.heal();
    let reply = request_async(&address, b_file, &[]).await;
    assert!(reply.complete && reply.body == b);
    proxy.flip_body_byte(300 << 10);
    let reply = request_async(&address, a_file, &[]).await;
    assert!(!reply.complete, "a failure is retried at the next read, and fails again: {}", reply.head);
    // The last block alone, held until the digest matches: the error comes before any byte.
    let block = 64 << 10;
    assert!(a.len() % block > 0, "the file ends inside a block");
    let range = format!("bytes={}-", a.len() / block * block);
    let reply = request_async(&address, a_file, &[("Range", range.as_str())]).await;
    assert_eq!(reply.status, 503, "{}", reply.head);
    assert_eq!(reply.json()["error"]["code"], "origin_corrupt");

    // Healed: the next read tries the origin again, and every byte is right.
    proxy.heal();
    let reply = request_async(&address, a_file, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.head);
    assert!(reply.complete && reply.body == a, "the file is served whole once the wire heals");
    // From disk now, even with the wire damaging everything.
    proxy.flip_body_byte(0);
    let reply = request_async(&address, a_file, &[]).await;
    assert!(reply.complete && reply.body == a);
}

/// One fault done to the next ranged read of a Hub file, and what a client may see of it.
struct Case {
    fault: Fault,
    /// How many times it is done in a row.
    times: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_errors_stalls_resets_short_bodies_and_whole_answers_never_reach_a_client_as_bytes() {
    let work = tempfile::tempdir().unwrap();
    let (origin_dir, cache) = (work.path().join("origin"), work.path().join("cache"));
    let cases = [
        Case { fault: Fault::Status(500), times: 1 },
        Case { fault: Fault::Status(503), times: 1 },
        Case { fault: Fault::Status(500), times: 20 },
        Case { fault: Fault::StallAfter(100 << 10), times: 1 },
        Case { fault: Fault::ResetAfter(100 << 10), times: 1 },
        Case { fault: Fault::CloseAfter(100 << 10), times: 1 },
        Case { fault: Fault::DropRange, times: 2 },
    ];
    // One file per case, one read between cases, one redirected.
    let files: Vec<Vec<u8>> =
        (0..cases.len() + 2).map(|i| one_tensor_safetensors(&noise(512 << 10, 10 + i as u64))).collect();
    let repos: Vec<_> = files.iter().enumerate().map(|(i, file)| (format!("org/m{i}"), file.as_slice())).collect();
    let (origin, _origin_server) = hub_origin(&origin_dir, &repos).await;
    let proxy = FaultProxy::start(&origin).await;
    let elsewhere = FaultProxy::start(&origin).await;

    let specs = (0..files.len()).map(|i| SourceSpec::Hub { repo: format!("org/m{i}"), revision: None }).collect();
    let mut config = Config::serving(specs);
    config.hub_source.endpoint = Some(format!("http://{}/hf", proxy.address));
    // Long enough that a busy machine never stalls a healthy answer this long.
    config.hub_source.read_timeout_secs = 3;
    config.hub_source.retries = 2;
    config.hub_source.token = Some("hf_secret".into());
    config.cache.dir = Some(cache.clone());
    config.cache.block_bytes = 64 << 10;
    let (address, server) = serve(config).await;
    let path = |i: usize| format!("/models/org%2Fm{i}/file");
    let (other, redirected) = (cases.len(), cases.len() + 1);
    assert!(proxy.authorized_requests() > 0, "the token goes to the Hub");

    for (i, case) in cases.iter().enumerate() {
        let what = format!("{:?} x{}", case.fault, case.times);
        for _ in 0..case.times {
            proxy.inject(case.fault.clone());
        }
        let (held, ranged) = (blocks_in(&cache), proxy.ranged_requests());
        let reply = request_async(&address, &path(i), &[]).await;
        let sent = proxy.ranged_requests() - ranged;
        // An error answer is retried `retries` (2) times; a body cut short is not retried.
        let bound = if matches!(case.fault, Fault::Status(_)) { (case.times + 1).min(3) } else { 1 };
        assert_eq!(sent, bound as u64, "{what}: ranged requests");
        if reply.complete && reply.status == 200 {
            assert!(reply.body == files[i], "{what}: a whole body with wrong bytes");
        } else {
            assert_eq!(blocks_in(&cache), held, "{what}: a block of a failed fill was kept");
            assert!(matches!(reply.status, 0 | 200 | 503), "{what}: {}", reply.head);
        }
        proxy.heal();
        // A source whose read failed is degraded, its uncached bytes refused at once, until
        // its next listing.
        server.rescan().await;
        // Another model serves meanwhile, and this one once the origin heals.
        let reply = request_async(&address, &path(other), &[]).await;
        assert!(reply.complete && reply.body == files[other], "{what}: another model");
        let again = request_async(&address, &path(i), &[]).await;
        assert!(
            again.complete && again.body == files[i],
            "{what}: after healing: {} {}",
            again.head,
            String::from_utf8_lossy(&again.body)
        );
    }

    // A `resolve` sent elsewhere: followed, without the token.
    proxy.inject(Fault::RedirectTo(elsewhere.address.clone()));
    let reply = request_async(&address, &path(redirected), &[]).await;
    assert!(reply.complete && reply.body == files[redirected], "{}", reply.head);
    assert_eq!(elsewhere.ranged_requests(), 1, "the redirect was followed");
    assert_eq!(elsewhere.authorized_requests(), 0, "Authorization followed a redirect to another host");
}
