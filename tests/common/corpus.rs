//! The models the loader tests serve (the S3 endpoint's, the Hub API's): official 1.2.3 and
//! 2.1.2 files (zstd, seekable), the safetensors peers' checkpoints (one sharded by
//! `huggingface_hub`), files beside models, and 600 small models; with each tensor's bytes as
//! the official reader returned them.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
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
    let tensors = listing["objects"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, object)| (name.clone(), read.join(object["parts"]["data"]["bin"].as_str().unwrap())))
        .collect();
    expected.insert("v2/demo-seekable".to_owned(), tensors);

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
