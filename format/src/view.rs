//! The safetensors view of a manifest, planned purely: which objects a safetensors file can
//! hold (dense, one `data` component, a dtype safetensors defines, bytes that match the shape;
//! every other object left out with the reason), how they are laid out (the safetensors
//! library's order: widest elements first, then by name, so every tensor is aligned to its
//! element), split into shards of at most a given size with a Hugging Face index when larger,
//! and each file's header (length field, JSON padded to 8 bytes, `__metadata__` from the
//! attributes). A model stored as safetensors is its own view: its file, or its index and
//! shards, under their stored names, never rebuilt.

use std::ops::Range;
use std::sync::Arc;

use serde_json::{Map, Value as Json, json};

use crate::json::cbor_to_json;
use crate::safetensors::{DTYPES, Mapped};
use crate::{Component, Container, DType, Manifest, Object, Value};

/// The view's file when it is one file.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The index of a sharded view (the name `transformers` and vLLM look for).
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The name of shard `number` (from 1) of `count`, as `huggingface_hub` names them.
pub fn shard_name(number: usize, count: usize) -> String {
    format!("model-{number:05}-of-{count:05}.safetensors")
}

/// Whether `name` is the name of a file a view may have (a safetensors file or the index):
/// the only names the view routes and keys answer.
pub fn is_view_file_name(name: &str) -> bool {
    name == INDEX_FILE || (name.ends_with(".safetensors") && name.len() > ".safetensors".len())
}

/// The media type a file of a model's directory is served as: JSON for `.json` files (the
/// index, configs), bytes otherwise.
pub fn media_type(name: &str) -> &'static str {
    if name.ends_with(".json") { "application/json" } else { "application/octet-stream" }
}

/// The safetensors view of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    /// The index first when sharded, then the safetensors files in order.
    pub files: Vec<ViewFile>,
    /// Objects a safetensors file cannot hold, in manifest order.
    pub excluded: Vec<Excluded>,
}

/// One file of a view.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewFile {
    pub name: String,
    pub len: u64,
    pub bytes: ViewBytes,
}

/// Where a view file's bytes come from.
#[derive(Debug, Clone, PartialEq)]
pub enum ViewBytes {
    /// The model's stored file of this index, as it is.
    Stored { file: usize },
    /// Built: `head` (the header, or the whole index), then each tensor's bytes in order;
    /// `layout` names the head (16 hex digits of its SHA-256), so ETags can tell layouts apart.
    Built { head: Arc<[u8]>, tensors: Arc<[ViewTensor]>, layout: String },
}

/// A tensor's place in a built view file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewTensor {
    /// Its object's index in the manifest.
    pub object: usize,
    /// Its bytes within the view file.
    pub range: Range<u64>,
}

/// An object left out of the view, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Excluded {
    pub object: String,
    pub reason: String,
}

impl View {
    /// The file named `name`.
    pub fn file(&self, name: &str) -> Option<&ViewFile> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Whether the view is an index and shards rather than one file.
    pub fn is_sharded(&self) -> bool {
        self.files.first().is_some_and(|f| f.name == INDEX_FILE)
    }
}

/// The safetensors dtype of a dense object's `data` component, or why it has none.
fn safetensors_dtype(component: &Component) -> Result<Mapped, String> {
    let logical = component.logical_type.as_deref();
    if component.dtype == DType::Bool {
        return Ok(DTYPES[0]);
    }
    DTYPES.iter().copied().find(|m| m.dtype == component.dtype && m.logical_type == logical).ok_or_else(
        || match logical {
            Some(logical) => {
                format!("safetensors has no dtype for {} with logical type {logical}", component.dtype.name())
            }
            None => format!("safetensors has no dtype for {}", component.dtype.name()),
        },
    )
}

/// How a safetensors file holds `object`: its dtype, or why it cannot.
fn holdable(object: &Object) -> Result<Mapped, String> {
    if object.name == "__metadata__" {
        return Err("the name __metadata__ is reserved by safetensors for the file's metadata".into());
    }
    if let Some(ggml) = crate::gguf::quantized_object(object) {
        let name = ggml.name;
        return Err(format!(
            "safetensors has no dtype for GGML {name} blocks; the object's route serves them as stored"
        ));
    }
    if object.format != "dense" {
        return Err(format!("safetensors holds only dense tensors, not the {} layout", object.format));
    }
    let [data] = &object.components[..] else {
        return Err(format!("a dense tensor has one data component, this has {}", object.components.len()));
    };
    if data.role != "data" {
        return Err(format!("a dense tensor's component is data, not {}", data.role));
    }
    if let crate::Encoding::Unregistered(name) = &data.encoding {
        return Err(format!("its encoding {name} is not registered, so its bytes cannot be decoded"));
    }
    let mapped = safetensors_dtype(data)?;
    let elements = object.shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
    let expected = elements.and_then(|n| n.checked_mul(mapped.bits)).filter(|bits| bits % 8 == 0).map(|bits| bits / 8);
    if expected != Some(data.decoded_length) {
        return Err(format!(
            "its {} bytes are not what {} elements of {} take",
            data.decoded_length,
            elements.map_or("too many".into(), |n| n.to_string()),
            mapped.name
        ));
    }
    Ok(mapped)
}

/// A built file's bytes, named by a digest of its head.
fn built(head: Vec<u8>, tensors: Vec<ViewTensor>) -> ViewBytes {
    use sha2::Digest as _;
    let layout = hex::encode(&sha2::Sha256::digest(&head)[..8]);
    ViewBytes::Built { head: head.into(), tensors: tensors.into(), layout }
}

/// `__metadata__` of every view file: the model's attributes, strings as they are and other
/// values JSON-encoded (safetensors metadata holds only strings), and `format: pt` when the
/// attributes name no format, because `transformers` refuses a file whose metadata lacks it.
fn metadata(attributes: Option<&Value>) -> Map<String, Json> {
    let mut metadata = Map::new();
    match attributes {
        Some(Value::Map(entries)) => {
            for (key, value) in entries {
                let key = match key {
                    Value::Text(text) => text.clone(),
                    other => cbor_to_json(other).to_string(),
                };
                let value = match value {
                    Value::Text(text) => text.clone(),
                    other => cbor_to_json(other).to_string(),
                };
                metadata.insert(key, Json::String(value));
            }
        }
        Some(other) => {
            metadata.insert("attributes".into(), Json::String(cbor_to_json(other).to_string()));
        }
        None => {}
    }
    metadata.entry("format").or_insert_with(|| Json::String("pt".into()));
    metadata
}

/// A tensor held by the view, before it is placed.
struct Held<'m> {
    object: usize,
    name: &'m str,
    shape: &'m [u64],
    dtype: Mapped,
    len: u64,
}

/// One built safetensors file of `tensors`, in the order given.
fn built_file(name: String, tensors: &[Held], metadata: &Map<String, Json>) -> ViewFile {
    let mut header = Map::new();
    if !metadata.is_empty() {
        header.insert("__metadata__".into(), Json::Object(metadata.clone()));
    }
    let mut at = 0u64;
    let mut offsets = Vec::with_capacity(tensors.len());
    for tensor in tensors {
        header.insert(
            tensor.name.to_owned(),
            json!({ "dtype": tensor.dtype.name, "shape": tensor.shape, "data_offsets": [at, at + tensor.len] }),
        );
        offsets.push(at..at + tensor.len);
        at += tensor.len;
    }
    let mut text = serde_json::to_vec(&Json::Object(header)).expect("JSON values serialize");
    // Padded with spaces, as the safetensors library pads, so the data region starts 8-aligned.
    while (text.len() + 8) % 8 != 0 {
        text.push(b' ');
    }
    let data_start = 8 + text.len() as u64;
    let mut head = Vec::with_capacity(text.len() + 8);
    head.extend_from_slice(&(text.len() as u64).to_le_bytes());
    head.extend_from_slice(&text);
    let tensors = tensors
        .iter()
        .zip(offsets)
        .map(|(t, r)| ViewTensor { object: t.object, range: data_start + r.start..data_start + r.end })
        .collect();
    ViewFile { name, len: data_start + at, bytes: built(head, tensors) }
}

/// The view of `manifest`, whose stored files are `stored` (name and size, in the model's file
/// order). Built files hold at most `shard_bytes` of tensor data each (a single larger tensor
/// has a shard to itself); a model whose data fits is one `model.safetensors`.
pub fn plan(manifest: &Manifest, stored: &[(&str, u64)], shard_bytes: u64) -> View {
    if manifest.container == Container::Safetensors {
        let files = stored
            .iter()
            .enumerate()
            .map(|(file, &(name, len))| {
                // A checkpoint's index keeps the name loaders look for; a lone file takes the view's name.
                let name = match (file, stored.len()) {
                    (0, 1) => SINGLE_FILE.to_owned(),
                    (0, _) => INDEX_FILE.to_owned(),
                    _ => name.to_owned(),
                };
                ViewFile { name, len, bytes: ViewBytes::Stored { file } }
            })
            .collect();
        return View { files, excluded: Vec::new() };
    }
    let mut held = Vec::new();
    let mut excluded = Vec::new();
    for (index, object) in manifest.objects.iter().enumerate() {
        match holdable(object) {
            Ok(dtype) => held.push(Held {
                object: index,
                name: &object.name,
                shape: &object.shape,
                dtype,
                len: object.components[0].decoded_length,
            }),
            Err(reason) => excluded.push(Excluded { object: object.name.clone(), reason }),
        }
    }
    held.sort_by(|a, b| b.dtype.bits.cmp(&a.dtype.bits).then_with(|| a.name.cmp(b.name)));
    let metadata = metadata(manifest.attributes.as_ref());
    let total: u64 = held.iter().map(|t| t.len).sum();
    if total <= shard_bytes {
        return View { files: vec![built_file(SINGLE_FILE.into(), &held, &metadata)], excluded };
    }
    let mut groups: Vec<Range<usize>> = Vec::new();
    let (mut start, mut size) = (0, 0u64);
    for (i, tensor) in held.iter().enumerate() {
        if i > start && size + tensor.len > shard_bytes {
            groups.push(start..i);
            (start, size) = (i, 0);
        }
        size += tensor.len;
    }
    groups.push(start..held.len());
    let count = groups.len();
    let shards: Vec<ViewFile> = groups
        .into_iter()
        .enumerate()
        .map(|(n, group)| built_file(shard_name(n + 1, count), &held[group], &metadata))
        .collect();
    let mut weight_map = Map::new();
    for shard in &shards {
        if let ViewBytes::Built { tensors, .. } = &shard.bytes {
            for tensor in tensors.iter() {
                weight_map.insert(manifest.objects[tensor.object].name.clone(), Json::String(shard.name.clone()));
            }
        }
    }
    let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let head = serde_json::to_vec_pretty(&index).expect("JSON values serialize");
    let mut files = vec![ViewFile { name: INDEX_FILE.into(), len: head.len() as u64, bytes: built(head, Vec::new()) }];
    files.extend(shards);
    View { files, excluded }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::safetensors::{parse_file, parse_index};
    use crate::{ByteOrder, DigestScope, Encoding};

    fn dense(name: &str, dtype: DType, logical: Option<&str>, shape: &[u64], len: u64) -> Object {
        Object {
            name: name.into(),
            shape: shape.to_vec(),
            format: "dense".into(),
            attributes: None,
            components: vec![Component {
                role: "data".into(),
                dtype,
                logical_type: logical.map(str::to_owned),
                offset: 4096,
                stored_length: len / 2,
                encoding: Encoding::Zstd,
                decoded_length: len,
                digest: None,
                digest_scope: DigestScope::Stored,
                byte_order: ByteOrder::Little,
                file: 0,
            }],
        }
    }

    fn manifest(objects: Vec<Object>, attributes: Option<Value>) -> Manifest {
        Manifest::new(Container::V2, Some("2".into()), attributes, objects, 8192..8300, 8400).unwrap()
    }

    /// The built file's bytes with each tensor's data filled with its object index.
    fn bytes_of(file: &ViewFile) -> Vec<u8> {
        let ViewBytes::Built { head, tensors, .. } = &file.bytes else { panic!("built") };
        let mut bytes = head.to_vec();
        for t in tensors.iter() {
            assert_eq!(t.range.start, bytes.len() as u64, "tensors tile the data region");
            bytes.extend(std::iter::repeat_n(t.object as u8, (t.range.end - t.range.start) as usize));
        }
        assert_eq!(bytes.len() as u64, file.len);
        bytes
    }

    #[test]
    fn a_view_is_a_valid_safetensors_file_with_dtypes_mapped_back_and_others_left_out() {
        let mut sparse = dense("sparse", DType::F32, None, &[2, 2], 16);
        sparse.format = "zt.sparse_csr/1".into();
        let attributes = Value::Map(vec![
            (Value::Text("note".into()), Value::Text("hi".into())),
            (Value::Text("layers".into()), Value::Integer(4.into())),
        ]);
        let m = manifest(
            vec![
                dense("b", DType::BF16, None, &[3], 6),
                dense("flag", DType::U8, Some("bool"), &[2], 2),
                dense("a", DType::F64, None, &[2], 16),
                dense("f8", DType::U8, Some("f8_e4m3fn"), &[5], 5),
                dense("c", DType::F32, Some("complex64"), &[2], 16),
                dense("c128", DType::F64, Some("complex128"), &[1], 16),
                dense("f4", DType::U8, Some("f4_e2m1"), &[6], 3),
                dense("short", DType::F32, None, &[4], 12),
                dense("legacy_bool", DType::Bool, None, &[3], 3),
                sparse,
            ],
            Some(attributes),
        );
        let view = plan(&m, &[("m.zt", 8400)], u64::MAX);
        assert!(!view.is_sharded());
        let [file] = &view.files[..] else { panic!("one file") };
        assert_eq!(file.name, "model.safetensors");
        let header = parse_file(&bytes_of(file)).expect("a valid safetensors file");
        let got: Vec<(&str, &str, Vec<u64>)> =
            header.tensors.iter().map(|t| (t.name.as_str(), t.dtype.name, t.shape.clone())).collect();
        assert_eq!(
            got,
            [
                ("a", "F64", vec![2]),
                ("c", "C64", vec![2]),
                ("b", "BF16", vec![3]),
                ("f8", "F8_E4M3", vec![5]),
                ("flag", "BOOL", vec![2]),
                ("legacy_bool", "BOOL", vec![3]),
                ("f4", "F4", vec![6]),
            ],
            "widest first, then by name"
        );
        let metadata = [("format".into(), "pt".into()), ("layers".into(), "4".into()), ("note".into(), "hi".into())];
        assert_eq!(header.metadata, metadata, "non-strings JSON-encoded, format added");
        assert_eq!((8 + header.span.end - header.span.start) % 8, 0, "the data region starts 8-aligned");
        let reasons: Vec<(&str, &str)> =
            view.excluded.iter().map(|e| (e.object.as_str(), e.reason.split(' ').next().unwrap())).collect();
        assert_eq!(reasons, [("c128", "safetensors"), ("short", "its"), ("sparse", "safetensors")]);
    }

    #[test]
    fn a_large_view_is_split_into_shards_with_an_index() {
        let m = manifest((0..5).map(|i| dense(&format!("w{i}"), DType::F32, None, &[25], 100)).collect(), None);
        let view = plan(&m, &[("m.zt", 8400)], 250);
        let names: Vec<&str> = view.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "model.safetensors.index.json",
                "model-00001-of-00003.safetensors",
                "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors"
            ]
        );
        let ViewBytes::Built { head, .. } = &view.files[0].bytes else { panic!("built") };
        let index = parse_index(head).unwrap();
        assert_eq!(index.weight_map[4], ("w4".into(), "model-00003-of-00003.safetensors".into()));
        assert_eq!(index.metadata, [("total_size".into(), json!(500))]);
        for shard in &view.files[1..] {
            let header = parse_file(&bytes_of(shard)).unwrap();
            assert!(header.tensors.iter().all(|t| index.weight_map.contains(&(t.name.clone(), shard.name.clone()))));
        }
        let single = plan(&m, &[("m.zt", 8400)], 500);
        assert_eq!(single.files.len(), 1, "a model whose data fits is one file");
    }

    #[test]
    fn a_model_stored_as_safetensors_is_its_own_view() {
        let m = Manifest::new(Container::Safetensors, None, None, vec![], 8..16, 16).unwrap();
        let one = plan(&m, &[("x.safetensors", 16)], 1);
        assert_eq!(one.files, [ViewFile { name: SINGLE_FILE.into(), len: 16, bytes: ViewBytes::Stored { file: 0 } }]);
        let sharded = plan(&m, &[("x.safetensors.index.json", 50), ("a.safetensors", 16), ("b.safetensors", 20)], 1);
        let names: Vec<(&str, &ViewBytes)> = sharded.files.iter().map(|f| (f.name.as_str(), &f.bytes)).collect();
        assert_eq!(
            names,
            [
                (INDEX_FILE, &ViewBytes::Stored { file: 0 }),
                ("a.safetensors", &ViewBytes::Stored { file: 1 }),
                ("b.safetensors", &ViewBytes::Stored { file: 2 })
            ]
        );
        assert!(sharded.is_sharded());
    }

    #[test]
    fn view_file_names_are_safetensors_files_and_the_index() {
        assert!(is_view_file_name("model.safetensors"));
        assert!(is_view_file_name("model-00001-of-00002.safetensors"));
        assert!(is_view_file_name(INDEX_FILE));
        assert!(!is_view_file_name(".safetensors"));
        assert!(!is_view_file_name("file"));
        assert!(!is_view_file_name("x.safetensors.index.json"));
    }
}
