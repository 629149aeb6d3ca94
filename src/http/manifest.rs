//! A model's manifest as the HTTP contract renders it: the format's JSON of the manifest with
//! the model's id, version and pinned URL, every stored file's, object's and component's URL,
//! and its safetensors view (the files, and the objects left out with why), with a strong ETag
//! that is a digest of the body itself (so a change in how the server renders it changes the
//! tag too). The service keeps one rendering per model version and renders large ones ahead,
//! after the scan that found them, with [`render`].

use bytes::Bytes;
use serde_json::json;

use crate::api;
use crate::catalog::Model;
use crate::format::json::manifest_json;
use crate::format::view::View;
use crate::format::{Manifest, Object};
use crate::service::{Rendered, version_token};

/// The manifest of `model` (serving `manifest`, whose safetensors view is `view`) as JSON.
pub(crate) fn render(model: &Model, manifest: &Manifest, view: &View) -> Rendered {
    let mut doc = manifest_json(manifest);
    doc["id"] = json!(model.id);
    doc["model_version"] = json!(version_token(model));
    doc["pinned_url"] = json!(api::model_url(&format!("{}@{}", model.id, version_token(model))));
    doc["files"] = model
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            json!({ "name": f.name, "size": model.file_len(manifest, i), "url": api::stored_file_url(&model.id, &f.name) })
        })
        .collect();
    if let Some(objects) = doc["objects"].as_array_mut() {
        for (object, rendered) in manifest.objects.iter().zip(objects) {
            add_urls(rendered, model, object);
        }
    }
    doc["safetensors_view"] = json!({
        "files": view.files.iter().map(|f| json!({
            "name": f.name,
            "size": f.len,
            "url": api::view_file_url(&model.id, &f.name),
        })).collect::<Vec<_>>(),
        "excluded": view.excluded.iter().map(|e| json!({ "object": e.object, "reason": e.reason })).collect::<Vec<_>>(),
    });
    let body = serde_json::to_vec(&doc).expect("JSON values serialize");
    let digest = <sha2::Sha256 as sha2::Digest>::digest(&body);
    Rendered { etag: format!("\"{}\"", hex::encode(&digest[..16])), body: sendable(body) }
}

/// Adds to an object's rendered JSON its URL, and each component's URL and the name of the
/// stored file its bytes live in.
pub(crate) fn add_urls(rendered: &mut serde_json::Value, model: &Model, object: &Object) {
    if let Some(components) = rendered["components"].as_array_mut() {
        for (component, rendered) in object.components.iter().zip(components) {
            rendered["url"] = json!(api::component_url(&model.id, &object.name, &component.role));
            rendered["file"] = json!(model.files.get(component.file).map(|f| f.name.as_str()));
        }
    }
    rendered["url"] = json!(api::object_url(&model.id, &object.name));
}

/// `rendered` with the model's signature (`signature`, its JSON) as its first member, and an
/// ETag that covers it: the rendering is kept per model version, the signature's verdict per
/// version of its signed directory, so they are joined per request, without copying the
/// rendering (the body goes as two pieces).
pub(crate) fn with_signature(rendered: &Rendered, signature: &serde_json::Value) -> (String, [Bytes; 2]) {
    let member = format!("{{\"signature\":{signature},");
    let digest = <sha2::Sha256 as sha2::Digest>::digest(member.as_bytes());
    let etag = format!("{}-{}\"", rendered.etag.trim_end_matches('"'), hex::encode(&digest[..8]));
    // Every rendering is a JSON object with members: its `{` gives way to the signature's.
    (etag, [Bytes::from(member), rendered.body.slice(1..)])
}

/// A body rendered once and sent many times (a large manifest's JSON): kept in a temporary
/// file, so each response sends it with `sendfile` instead of copying it (bench/README.md:
/// "Design choices measured"). Small bodies, and any when no temporary file can be written,
/// stay ordinary heap bytes.
fn sendable(body: Vec<u8>) -> Bytes {
    const WORTH_A_FILE: usize = 64 << 10;
    if body.len() < WORTH_A_FILE {
        return Bytes::from(body);
    }
    match crate::storage::mapped::MappedFile::temporary(&body) {
        Ok(file) => Bytes::from_owner(file),
        Err(e) => {
            tracing::warn!(error = %e, "cannot keep a rendered body in a temporary file; it will be copied per response");
            Bytes::from(body)
        }
    }
}
