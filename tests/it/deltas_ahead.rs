//! Deltas computed ahead (`refits.deltas_ahead`): a client asks the deltas between two versions
//! of a lineage for some regions; the trainer publishes the next version, and after the rescan
//! the server computes, with no request, the deltas from the version before it of those
//! regions, so the next request for them is answered from the store, and its deltas apply. With
//! the switch off, nothing is computed before it is asked.

use crate::common;
use crate::deltas::{post, split_deltas};

use std::path::Path;
use std::time::{Duration, Instant};

use common::{metric, request_async, serve};
use safetensors::Dtype;
use ztserve::config::{Config, Refits, SourceSpec, Sources};
use ztserve::format::delta;

/// The regions a rank asks: (object, slice).
const ASKED: &[(&str, Option<&str>)] = &[("w", Some("0:16")), ("w", Some("16:64")), ("b", None)];

/// Version `step`'s bytes of `w` (bf16, 64 x 32) and `b` (f32, 16): the first version's with
/// every 50th element changed per step.
fn tensors(step: u8) -> (Vec<u8>, Vec<u8>) {
    let (mut w, mut b) = (common::noise(64 * 32 * 2, 1), common::noise(16 * 4, 2));
    for element in (usize::from(step)..64 * 32).step_by(50) {
        w[element * 2] ^= step;
    }
    b[usize::from(step) * 4] ^= step;
    (w, b)
}

/// Writes `policy/step-00000N/model.safetensors`, then its `READY` marker.
fn publish(dir: &Path, step: u8) {
    let folder = dir.join(format!("policy/step-{step:06}"));
    std::fs::create_dir_all(&folder).unwrap();
    let (w, b) = tensors(step);
    let file = common::safetensors_file(&[("w", Dtype::BF16, vec![64, 32], &w), ("b", Dtype::F32, vec![16], &b)]);
    std::fs::write(folder.join("model.safetensors"), file).unwrap();
    std::fs::write(folder.join("READY"), b"").unwrap();
}

fn config(dir: &Path, store: &Path, deltas_ahead: bool) -> Config {
    Config {
        sources: Sources { paths: vec![SourceSpec::local(dir)], rescan_interval_secs: 3600, ..Default::default() },
        refits: Refits {
            lineages: vec!["policy".into()],
            keep_versions: 2,
            delta_dir: Some(store.to_path_buf()),
            deltas_ahead,
            ..Refits::default()
        },
        ..Config::default()
    }
}

/// The deltas request from step `from` to step `to` of the regions asked.
async fn deltas(address: &str, from: u8, to: u8) -> Vec<Vec<u8>> {
    let regions: Vec<String> = ASKED
        .iter()
        .map(|(object, slice)| match slice {
            Some(slice) => format!(r#"{{"object":"{object}","slice":"{slice}"}}"#),
            None => format!(r#"{{"object":"{object}"}}"#),
        })
        .collect();
    let body = format!(r#"{{"from":"policy/step-{from:06}","regions":[{}]}}"#, regions.join(","));
    let reply = post(address, &format!("/models/policy/step-{to:06}/deltas"), &body).await;
    assert_eq!(reply.status, 200, "{}", String::from_utf8_lossy(&reply.body));
    assert!(reply.complete);
    split_deltas(&reply.body)
}

/// A region of step `step` as its own route sends it.
async fn region(address: &str, step: u8, (object, slice): (&str, Option<&str>)) -> Vec<u8> {
    let mut url = format!("/models/policy/step-{step:06}/objects/{object}");
    if let Some(slice) = slice {
        url = format!("{url}?slice={slice}");
    }
    let reply = request_async(address, &url, &[]).await;
    assert_eq!(reply.status, 200, "{url}: {}", String::from_utf8_lossy(&reply.body));
    reply.body
}

fn files_in(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rescan_lists_a_new_version_the_deltas_last_asked_are_computed_ahead_and_kept() {
    let (dir, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    publish(dir.path(), 1);
    publish(dir.path(), 2);
    let (address, server) = serve(config(dir.path(), store.path(), true)).await;
    assert_eq!(deltas(&address, 1, 2).await.len(), ASKED.len());
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "computed")]), 3.0);
    assert_eq!(metric("ztserve_deltas_ahead_total", &[]), 0.0);

    // The trainer publishes step 3; the rescan lists it (and retires step 1).
    publish(dir.path(), 3);
    server.rescan().await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric("ztserve_deltas_ahead_total", &[]) < 3.0 {
        assert!(Instant::now() < deadline, "{} deltas computed ahead", metric("ztserve_deltas_ahead_total", &[]));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metric("ztserve_deltas_ahead_total", &[]), 3.0);
    assert_eq!(files_in(store.path()), 6);
    assert_eq!(metric("ztserve_deltas_total", &[]), 3.0, "no request was answered meanwhile");

    // The fleet's first request for step 3 finds every delta kept, and each applies.
    let found = deltas(&address, 2, 3).await;
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "kept")]), 3.0);
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "computed")]), 3.0);
    assert_eq!(metric("ztserve_delta_compute_seconds_count", &[]), 6.0);
    for (delta_bytes, &asked) in found.iter().zip(ASKED) {
        let header = delta::parse_header(delta_bytes).unwrap();
        if asked.0 == "w" {
            // `b` is small enough that the encoder may send it whole.
            assert_eq!(header.kind, delta::Kind::Patch, "{asked:?}");
        }
        let mut target = region(&address, 2, asked).await;
        delta::apply(delta_bytes, &mut target).unwrap();
        assert_eq!(target, region(&address, 3, asked).await, "{asked:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_deltas_ahead_off_nothing_is_computed_before_it_is_asked() {
    let (dir, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    publish(dir.path(), 1);
    publish(dir.path(), 2);
    let (address, server) = serve(config(dir.path(), store.path(), false)).await;
    deltas(&address, 1, 2).await;
    publish(dir.path(), 3);
    server.rescan().await;
    // Listed: step 3 answers, and a request computes its deltas itself.
    region(&address, 3, ASKED[0]).await;
    let found = deltas(&address, 2, 3).await;
    assert_eq!(found.len(), ASKED.len());
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "kept")]), 0.0);
    assert_eq!(metric("ztserve_deltas_total", &[("outcome", "computed")]), 6.0);
    assert_eq!(metric("ztserve_delta_compute_seconds_count", &[]), 6.0);
    assert_eq!(metric("ztserve_deltas_ahead_total", &[]), 0.0);
    assert_eq!(files_in(store.path()), 6);
}
