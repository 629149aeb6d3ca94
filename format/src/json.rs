//! JSON renderings of parsed manifests, shared by the CLI and the HTTP layer. CBOR has values
//! JSON lacks; they map to tagged objects so nothing is lost: byte strings to
//! `{"$bytes": "<hex>"}`, tags to `{"$tag": n, "value": …}`, maps with non-text keys to
//! `{"$map": [[key, value], …]}`, and non-finite floats to the strings `"NaN"`, `"Infinity"`
//! and `"-Infinity"`.

use serde_json::{Map, Value as Json, json};

use crate::{ByteOrder, Component, DigestScope, Manifest, Object, Value};

/// A CBOR value as JSON.
pub fn cbor_to_json(value: &Value) -> Json {
    match value {
        Value::Integer(i) => {
            let wide = i128::from(*i);
            if let Ok(v) = i64::try_from(wide) {
                Json::from(v)
            } else if let Ok(v) = u64::try_from(wide) {
                Json::from(v)
            } else {
                Json::String(wide.to_string())
            }
        }
        Value::Float(f) if f.is_finite() => json!(f),
        Value::Float(f) if f.is_nan() => json!("NaN"),
        Value::Float(f) => json!(if *f > 0.0 { "Infinity" } else { "-Infinity" }),
        Value::Text(t) => Json::String(t.clone()),
        Value::Bytes(b) => json!({ "$bytes": hex::encode(b) }),
        Value::Bool(b) => Json::Bool(*b),
        Value::Null => Json::Null,
        Value::Tag(tag, inner) => json!({ "$tag": tag, "value": cbor_to_json(inner) }),
        Value::Array(items) => Json::Array(items.iter().map(cbor_to_json).collect()),
        Value::Map(entries) => {
            if entries.iter().all(|(k, _)| k.is_text()) {
                let map: Map<String, Json> =
                    entries.iter().map(|(k, v)| (k.as_text().expect("checked").to_owned(), cbor_to_json(v))).collect();
                Json::Object(map)
            } else {
                let pairs = entries.iter().map(|(k, v)| json!([cbor_to_json(k), cbor_to_json(v)])).collect();
                json!({ "$map": Json::Array(pairs) })
            }
        }
        _ => Json::Null,
    }
}

pub fn component_json(component: &Component) -> Json {
    json!({
        "role": component.role,
        "dtype": component.dtype.name(),
        "type": component.logical_type,
        "offset": component.offset,
        "stored_length": component.stored_length,
        "encoding": component.encoding.name(),
        "decoded_length": component.decoded_length,
        "digest": component.digest.as_ref().map(|d| d.to_string()),
        "digest_covers": match component.digest_scope { DigestScope::Stored => "stored", DigestScope::Decoded => "decoded" },
        "byte_order": match component.byte_order { ByteOrder::Little => "little", ByteOrder::Big => "big" },
    })
}

pub fn object_json(object: &Object) -> Json {
    json!({
        "name": object.name,
        "shape": object.shape,
        "format": object.format,
        "attributes": object.attributes.as_ref().map(cbor_to_json),
        "components": object.components.iter().map(component_json).collect::<Vec<_>>(),
    })
}

pub fn manifest_json(manifest: &Manifest) -> Json {
    let mut doc = json!({
        "container": manifest.container.to_string(),
        "version": manifest.version,
        "file_length": manifest.file_len,
        "attributes": manifest.attributes.as_ref().map(cbor_to_json),
        "objects": manifest.objects.iter().map(object_json).collect::<Vec<_>>(),
    });
    if !manifest.shards.is_empty() {
        doc["shards"] = manifest
            .shards
            .iter()
            .map(|s| json!({ "name": s.name, "size": s.size, "digest": s.digest.to_string() }))
            .collect();
    }
    doc
}
