//! Versions a trainer publishes (`[refits] lineages`): of `policy/step-…/` folders, only the
//! newest `keep_versions` whose `READY` marker is written are listed and served; an older one,
//! or one not ready yet, answers 410 `version_gone` naming the versions kept, on every route of
//! the HTTP contract, while the other protocols answer it as a model they do not have. A
//! marker written and a rescan publish the next version and retire the oldest; models outside
//! any lineage are untouched.

use crate::common;

use std::fs;
use std::path::Path;

use common::{request_async, serve_with_s3};
use ztserve::config::{Config, Refits, SourceSpec, Sources};

/// The bytes of version `step`'s one tensor `w`.
fn weights(step: u8) -> Vec<u8> {
    vec![step; 8]
}

/// `policy/step-00000N/` for N in 1..=6, each a model whose tensor `w` holds N, with an empty
/// `READY` in those of `ready`; and `solo.safetensors` and `other/step-000001/`, outside any
/// lineage.
fn publish(dir: &Path, ready: &[u8]) {
    for step in 1..=6u8 {
        let folder = dir.join(format!("policy/step-{step:06}"));
        fs::create_dir_all(&folder).unwrap();
        fs::write(folder.join("model.safetensors"), common::one_tensor_safetensors(&weights(step))).unwrap();
        fs::write(folder.join("config.json"), br#"{"model_type": "llama"}"#).unwrap();
        if ready.contains(&step) {
            fs::write(folder.join("READY"), b"").unwrap();
        }
    }
    fs::write(dir.join("solo.safetensors"), common::one_tensor_safetensors(&[7; 4])).unwrap();
    fs::create_dir_all(dir.join("other/step-000001")).unwrap();
    fs::write(dir.join("other/step-000001/model.safetensors"), common::one_tensor_safetensors(&[9; 4])).unwrap();
}

fn config(dir: &Path) -> Config {
    Config {
        sources: Sources { paths: vec![SourceSpec::local(dir)], rescan_interval_secs: 3600, ..Default::default() },
        refits: Refits { lineages: vec!["policy".into()], keep_versions: 3, ..Refits::default() },
        ..Config::default()
    }
}

async fn listed_ids(address: &str) -> Vec<String> {
    let listing = request_async(address, "/models", &[]).await.json();
    listing["models"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

/// `path`'s 410 `version_gone`, and its message.
async fn gone(address: &str, path: &str) -> String {
    let reply = request_async(address, path, &[]).await;
    let json = reply.json();
    assert_eq!((reply.status, json["error"]["code"].as_str()), (410, Some("version_gone")), "{path}: {json}");
    json["error"]["message"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lineage_lists_its_newest_ready_versions_and_a_version_not_kept_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    // Ready: 1, 2, 3 and 5; 4 and 6 are still being written.
    publish(dir.path(), &[1, 2, 3, 5]);
    let (address, s3_address, server) = serve_with_s3(config(dir.path())).await;

    let kept = ["other/step-000001", "policy/step-000002", "policy/step-000003", "policy/step-000005", "solo"];
    assert_eq!(listed_ids(&address).await, kept);
    for step in [2u8, 3, 5] {
        let reply = request_async(&address, &format!("/models/policy/step-{step:06}/objects/w"), &[]).await;
        assert_eq!((reply.status, reply.body), (200, weights(step)), "step {step}");
    }
    // The marker is a file of its version like any other, and breaks nothing.
    let marker = request_async(&address, "/models/policy/step-000005/files/READY", &[]).await;
    assert_eq!((marker.status, marker.body.len()), (200, 0));

    let retired = gone(&address, "/models/policy/step-000001").await;
    assert_eq!(
        retired,
        "policy/step-000001 is no longer kept: lineage policy keeps step-000002, step-000003, step-000005 \
         (refits.keep_versions = 3)"
    );
    let unready = gone(&address, "/models/policy/step-000004/objects/w").await;
    assert!(unready.starts_with("policy/step-000004 is not published yet (no READY marker"), "{unready}");
    assert!(unready.contains("keeps step-000002, step-000003, step-000005"), "{unready}");
    gone(&address, "/models/policy%2Fstep-000006/files/model.safetensors").await;
    // Pinned to a version or not, a version not kept is gone.
    gone(&address, "/models/policy/step-000001@0123456789abcdef/objects/w").await;
    // A version never listed is not found, as any unknown model.
    let unknown = request_async(&address, "/models/policy/step-000007", &[]).await;
    assert_eq!((unknown.status, unknown.json()["error"]["code"].as_str()), (404, Some("model_not_found")));
    // The other protocols answer it as a model they do not have.
    let hub = request_async(&address, "/hf/api/models/policy/step-000001", &[]).await;
    assert_eq!(hub.status, 404, "{}", String::from_utf8_lossy(&hub.body));
    let s3 = request_async(&s3_address, "/models/policy/step-000001/model.safetensors", &[]).await;
    assert_eq!(s3.status, 404, "{}", String::from_utf8_lossy(&s3.body));
    let registry = request_async(&address, "/v2/policy/step-000001/manifests/latest", &[]).await;
    assert_eq!(registry.status, 404, "{}", String::from_utf8_lossy(&registry.body));
    assert!(String::from_utf8_lossy(&registry.body).contains("NAME_UNKNOWN"));

    // The trainer finishes step 6: the rescan lists it and retires step 2, the oldest kept.
    fs::write(dir.path().join("policy/step-000006/READY"), b"").unwrap();
    server.rescan().await;
    let kept = ["other/step-000001", "policy/step-000003", "policy/step-000005", "policy/step-000006", "solo"];
    assert_eq!(listed_ids(&address).await, kept);
    let step6 = request_async(&address, "/models/policy/step-000006/objects/w", &[]).await;
    assert_eq!((step6.status, step6.body), (200, weights(6)));
    let retired = gone(&address, "/models/policy/step-000002/objects/w").await;
    assert!(
        retired.contains("no longer kept: lineage policy keeps step-000003, step-000005, step-000006"),
        "{retired}"
    );
    // Step 4 is ready late: versions are kept by name, not by when they became ready, so it is
    // listed and step 3 retired.
    fs::write(dir.path().join("policy/step-000004/READY"), b"").unwrap();
    server.rescan().await;
    let kept = ["other/step-000001", "policy/step-000004", "policy/step-000005", "policy/step-000006", "solo"];
    assert_eq!(listed_ids(&address).await, kept);
    assert!(gone(&address, "/models/policy/step-000003").await.contains("no longer kept"));
}
