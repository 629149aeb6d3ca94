//! The models the loader tests serve (the S3 endpoint's, the Hub API's): official 1.2.3 and
//! 2.1.2 files (zstd, seekable), the safetensors peers' checkpoints (one sharded by
//! `huggingface_hub`), files beside models, and 600 small models; with each tensor's bytes as
//! the official reader returned them.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use ztserve::format::DType;

use super::run_interop_script;

/// Runs an official release's script (`official.py`, `official_v2.py`) with `args`.
pub fn official(venv: &str, script: &str, args: &[&Path]) {
    run_interop_script(venv, script, args);
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Writes the models under `models`; returns, by model id, each tensor's bytes as the official
/// reader returned them (a .bin path), for the models the loaders read.
pub fn write_loader_models(work: &Path, models: &Path) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let mut expected = BTreeMap::new();

    // An official 1.2.3 file: raw and zstd components of every dtype, fp8, complex, bf16, and
    // objects a safetensors file cannot hold.
    let zt12 = work.join("zt12");
    official("ztensor-1.2.3", "official.py", &[Path::new("write"), &zt12]);
    fs::create_dir_all(models.join("zt12")).unwrap();
    fs::copy(zt12.join("official.zt"), models.join("zt12/official.zt")).unwrap();
    let read = work.join("zt12-read");
    official("ztensor-1.2.3", "official.py", &[Path::new("read"), &zt12.join("official.zt"), &read]);
    let listing = read_json(&read.join("read.json"));
    let written = read_json(&zt12.join("expect.json"));
    let mut tensors = BTreeMap::new();
    for (name, object) in listing.as_object().unwrap() {
        if object.get("error").is_some() {
            // 1.2.3 cannot read its own complex64 object back: the bytes its writer was given.
            assert_eq!(name, "complex", "the only object 1.2.3 cannot read: {object}");
            tensors.insert(name.clone(), zt12.join(written["objects"][name]["data"].as_str().unwrap()));
        } else if object["components"].as_object().unwrap().len() == 1 {
            tensors.insert(name.clone(), read.join(object["components"]["data"].as_str().unwrap()));
        }
    }
    expected.insert("zt12/official".to_owned(), tensors);

    // Official 2.1.2 files: canonical, and seekable zstd with a part of 64 MiB.
    let v2 = work.join("v2");
    fs::create_dir_all(&v2).unwrap();
    official("ztensor-2.1.2", "official_v2.py", &[Path::new("write"), &v2]);
    fs::create_dir_all(models.join("v2")).unwrap();
    for file in ["canonical", "seekable"] {
        fs::copy(v2.join(format!("{file}.zt")), models.join(format!("v2/{file}.zt"))).unwrap();
        let read = work.join(format!("v2-{file}-read"));
        fs::create_dir_all(&read).unwrap();
        official("ztensor-2.1.2", "official_v2.py", &[Path::new("read"), &v2.join(format!("{file}.zt")), &read]);
        let listing = read_json(&read.join("read.json"));
        let mut tensors = BTreeMap::new();
        for (name, object) in listing["objects"].as_object().unwrap() {
            let parts = object["parts"].as_object().unwrap();
            if object["layout"] == "dense" && parts.len() == 1 {
                tensors.insert(name.clone(), read.join(parts["data"]["bin"].as_str().unwrap()));
            }
        }
        expected.insert(format!("v2/{file}"), tensors);
    }

    // The demo's seekable v2 file (written with the official Rust writer), whose dtypes every
    // loader has.
    fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/models/v2/seekable.zt"), models.join("v2/demo-seekable.zt"))
        .unwrap();
    let read = work.join("v2-demo-read");
    fs::create_dir_all(&read).unwrap();
    official("ztensor-2.1.2", "official_v2.py", &[Path::new("read"), &models.join("v2/demo-seekable.zt"), &read]);
    let listing = read_json(&read.join("read.json"));
    let tensors: BTreeMap<String, PathBuf> = listing["objects"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, object)| (name.clone(), read.join(object["parts"]["data"]["bin"].as_str().unwrap())))
        .collect();
    expected.insert("v2/demo-seekable".to_owned(), tensors.clone());
    // The same file at the top of the source: a model of a one-segment id, whose Hub
    // repository is in the namespace `local`, as huggingface_hub 2.x needs two segments.
    fs::copy(models.join("v2/demo-seekable.zt"), models.join("top.zt")).unwrap();
    expected.insert("top".to_owned(), tensors);

    // The safetensors peers' checkpoints, one sharded as save_pretrained shards.
    let peers = work.join("peers");
    fs::create_dir_all(&peers).unwrap();
    run_interop_script("client", "safetensors_peers.py", &[Path::new("write"), &peers]);
    for (id, entry) in read_json(&peers.join("expect.json")).as_object().unwrap() {
        for file in entry["files"].as_array().unwrap() {
            let file = file.as_str().unwrap();
            fs::create_dir_all(models.join(file).parent().unwrap()).unwrap();
            fs::copy(peers.join(file), models.join(file)).unwrap();
        }
        let tensors = entry["tensors"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(name, t)| (name.clone(), peers.join(t["bin"].as_str().unwrap())))
            .collect();
        expected.insert(id.clone(), tensors);
    }

    // Files beside models, as a Hugging Face repository has them: served under the model's
    // prefix (a nested one too); hidden ones (a download cache) are not.
    for (dir, name) in [
        ("hf/llama", "config.json"),
        ("hf/llama", "tokenizer.json"),
        ("hf/llama", "tokenizer/vocab.txt"),
        ("hf/llama", ".cache/huggingface/download/config.json.metadata"),
        ("zt12", "generation_config.json"),
    ] {
        let path = models.join(dir).join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, format!("{{\"file\": \"{name}\"}}")).unwrap();
    }

    // Enough small models that the listing pages.
    fs::create_dir_all(models.join("many")).unwrap();
    for i in 0..600u32 {
        let bytes = i.to_le_bytes();
        fs::write(models.join(format!("many/m{i:03}.zt")), super::model(&[("w", DType::U32, &bytes, false)])).unwrap();
    }
    expected
}

/// [`write_loader_models`], with a real config and tokenizer beside the sharded checkpoint
/// (`hf/llama`), as the Hub API's tests serve it.
pub fn write_hub_corpus(work: &Path, models: &Path) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let expected = write_loader_models(work, models);
    run_interop_script("hub-2.4.0", "hub_clients.py", &[Path::new("companions"), &models.join("hf/llama")]);
    expected
}

/// The repo id of model `id`, as docs/hub.md says: `local/name` for `name`, the id itself for
/// `namespace/name`, deeper ids joined after the first segment with `__`.
pub fn repo_of(id: &str) -> String {
    match id.split_once('/') {
        Some((namespace, rest)) => format!("{namespace}/{}", rest.replace('/', "__")),
        None => format!("local/{id}"),
    }
}

/// The repositories hub_clients.py loads from the corpus under `models` ([`write_hub_corpus`]),
/// each with its tensors' expected bytes and its companions' local copies; and how many
/// tensors they hold.
pub fn hub_repos(models: &Path, expected: &BTreeMap<String, BTreeMap<String, PathBuf>>) -> (Value, u64) {
    let companions: BTreeMap<&str, Vec<&str>> = BTreeMap::from([
        ("hf/llama", vec!["config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer/vocab.txt"]),
        ("zt12/official", vec!["generation_config.json"]),
    ]);
    let mut repos = serde_json::Map::new();
    let mut tensors = 0;
    for (id, bins) in expected {
        let dir_of_model = if id == "zt12/official" { "zt12" } else { id.as_str() };
        let companions: serde_json::Map<String, Value> = companions
            .get(id.as_str())
            .into_iter()
            .flatten()
            .map(|name| (name.to_string(), json!(models.join(dir_of_model).join(name))))
            .collect();
        let held: BTreeMap<&String, &PathBuf> = bins.iter().collect();
        tensors += held.len() as u64;
        repos.insert(repo_of(id), json!({ "id": id, "tensors": held, "companions": companions }));
    }
    (Value::Object(repos), tensors)
}

/// Runs hub_clients.py MODE PLAN in `venv`; its JSON summary.
pub async fn hub_clients(venv: &'static str, mode: &'static str, plan: &Path) -> Value {
    let plan = plan.to_owned();
    let out =
        tokio::task::spawn_blocking(move || run_interop_script(venv, "hub_clients.py", &[Path::new(mode), &plan]))
            .await
            .unwrap();
    serde_json::from_str(out.trim().lines().last().unwrap()).unwrap()
}

/// Drops from each repository's expected tensors those its safetensors view leaves out (a
/// safetensors file cannot hold them; the manifest says which).
pub async fn only_viewable(address: &str, repos: &mut Value) -> u64 {
    let mut tensors = 0;
    for (_, repo) in repos.as_object_mut().unwrap() {
        let id = repo["id"].as_str().unwrap().to_owned();
        let manifest = super::request_async(address, &format!("/models/{}", id.replace('/', "%2F")), &[]).await.json();
        let excluded: Vec<String> = manifest["safetensors_view"]["excluded"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["object"].as_str().unwrap().to_owned())
            .collect();
        let held = repo["tensors"].as_object_mut().unwrap();
        held.retain(|name, _| !excluded.contains(name));
        tensors += held.len() as u64;
    }
    tensors
}

/// Every file below `dir`, by its path below it.
pub fn files_below(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(at) = pending.pop() {
        for entry in fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).unwrap().to_str().unwrap().to_owned();
                found.push((relative, path));
            }
        }
    }
    found.sort();
    found
}

/// The loader corpus, with a real config and tokenizer beside the sharded checkpoint, in
/// `source`; the repositories the clients load, each with its tensors' expected bytes and its
/// companions' local copies.
pub async fn put_hub_corpus(dir: &Path, source: &super::ModelSource) -> (Value, u64) {
    let (work, models) = (dir.join("work"), dir.join("models"));
    let expected = write_hub_corpus(&work, &models);
    for (relative, path) in files_below(&models) {
        // The 600 small models page the S3 listing; the Hub's paging is checked below.
        if !relative.starts_with("many/") {
            source.put(&relative, &fs::read(&path).unwrap()).await;
        }
    }
    hub_repos(&models, &expected)
}
