//! Model files of several formats in one directory, through every protocol: a GGUF file beside
//! a safetensors checkpoint never takes the checkpoint's id (the checkpoint keeps the
//! directory's, the GGUF file is named by its path), the files beside them stay the
//! checkpoint's, and the Hub lists every file of the directory, as the Hub does.

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use common::{request_async, serve_with_s3};
use ztserve::config::{Config, SourceSpec};
use ztserve::format::gguf::FileBuilder;

const CONFIG: &[u8] = br#"{"model_type": "llama"}"#;

/// `same/`: `model.safetensors`, `config.json` and `model.gguf`; `named/`: `model.safetensors`,
/// `config.json` and `name-Q8_0.gguf`.
fn layouts(dir: &Path) {
    let weights = [1u8, 2, 3, 4, 5, 6, 7, 8];
    let checkpoint = common::safetensors_file(&[("w", safetensors::Dtype::U8, vec![8], &weights)]);
    let gguf = FileBuilder::new("llama").tensor("g", &[8], 0).build();
    for (directory, gguf_name) in [("same", "model.gguf"), ("named", "name-Q8_0.gguf")] {
        let at = dir.join(directory);
        fs::create_dir_all(&at).unwrap();
        fs::write(at.join("model.safetensors"), &checkpoint).unwrap();
        fs::write(at.join("config.json"), CONFIG).unwrap();
        fs::write(at.join(gguf_name), &gguf).unwrap();
    }
}

/// The `rfilename`s or `path`s of a JSON array of entries.
fn names(entries: &serde_json::Value, field: &str) -> BTreeSet<String> {
    entries.as_array().unwrap().iter().map(|e| e[field].as_str().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gguf_file_beside_a_checkpoint_leaves_it_its_id_and_its_files() {
    let dir = tempfile::tempdir().unwrap();
    layouts(dir.path());
    let config = Config::serving(vec![SourceSpec::Local(dir.path().to_path_buf())]);
    let (address, s3_address, _server) = serve_with_s3(config).await;

    // HTTP: four models, the checkpoints under their directories' ids.
    let listing = request_async(&address, "/models", &[]).await.json();
    let containers: Vec<(String, String)> = listing["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap().to_owned(), m["container"].as_str().unwrap().to_owned()))
        .collect();
    let expected =
        [("named", "safetensors"), ("named/name-Q8_0", "gguf"), ("same", "safetensors"), ("same/model", "gguf")];
    assert_eq!(containers, expected.map(|(id, c)| (id.to_owned(), c.to_owned())), "{listing}");
    for (id, container) in expected {
        let manifest = request_async(&address, &ztserve::api::model_url(id), &[]).await;
        assert_eq!(manifest.status, 200, "{id}");
        let object = if container == "gguf" { "g" } else { "w" };
        assert!(manifest.json()["objects"].as_array().unwrap().iter().any(|o| o["name"] == object), "{id}");
        let config = request_async(&address, &format!("{}/files/config.json", ztserve::api::model_url(id)), &[]).await;
        assert_eq!(config.status, if container == "gguf" { 404 } else { 200 }, "{id}: config.json is the checkpoint's");
    }

    // The Hub: each directory is one repository of all its files.
    // Top-level models are in the namespace `local`, as huggingface_hub 2.x needs two segments.
    for (repo, gguf) in [("local/same", "model.gguf"), ("local/named", "name-Q8_0.gguf")] {
        let id = repo;
        let info = request_async(&address, &format!("/hf/api/models/{id}"), &[]).await;
        assert_eq!(info.status, 200, "{id}: {}", String::from_utf8_lossy(&info.body));
        let files: BTreeSet<String> = ["config.json", gguf, "model.safetensors"].map(str::to_owned).into();
        assert_eq!(names(&info.json()["siblings"], "rfilename"), files, "{id}");
        let tree = request_async(&address, &format!("/hf/api/models/{id}/tree/main"), &[]).await;
        assert_eq!(names(&tree.json(), "path"), files, "{id}");
        let commit = info.json()["sha"].as_str().unwrap().to_owned();
        // Clients before huggingface_hub 2.x may name it by its one segment.
        let legacy = request_async(&address, &format!("/hf/api/models/{}", &id["local/".len()..]), &[]).await;
        assert_eq!(legacy.json()["sha"], commit, "{id}");
        for file in &files {
            let resolved = request_async(&address, &format!("/hf/{id}/resolve/{commit}/{file}"), &[]).await;
            assert_eq!(resolved.status, 200, "{id}/{file}");
            if file == "config.json" {
                assert_eq!(resolved.body, CONFIG);
            }
        }
    }
    // Listed once each; no repository of a GGUF file alone.
    let listed = request_async(&address, "/hf/api/models", &[]).await.json();
    assert_eq!(names(&listed, "id"), BTreeSet::from(["local/named".to_owned(), "local/same".to_owned()]), "{listed}");
    // Each listed as its checkpoint, whatever was found first.
    for entry in listed.as_array().unwrap() {
        assert_eq!(entry["tags"], serde_json::json!(["safetensors"]), "{entry}");
    }

    // S3: each checkpoint's keys hold its config and its weights.
    let keys = request_async(&s3_address, "/models?list-type=2", &[]).await;
    let body = String::from_utf8_lossy(&keys.body).into_owned();
    for key in ["same/config.json", "same/model.safetensors", "named/config.json", "named/model.safetensors"] {
        assert!(body.contains(&format!("<Key>{key}</Key>")), "{key}: {body}");
    }

    // OCI: each checkpoint's artifact has its config as a layer.
    for name in ["same", "named"] {
        let manifest = request_async(
            &address,
            &format!("/v2/{name}/manifests/latest"),
            &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
        )
        .await;
        assert_eq!(manifest.status, 200, "{name}");
        let titles: BTreeSet<String> = manifest.json()["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["annotations"]["org.opencontainers.image.title"].as_str().unwrap().to_owned())
            .collect();
        assert!(titles.contains("config.json") && titles.contains("model.safetensors"), "{name}: {titles:?}");
    }
}
