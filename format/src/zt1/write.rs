//! Writing 1.2 files that the official `ztensor==1.2.3` reader opens: blobs in call order at
//! 64-byte boundaries with zero padding, then the CBOR manifest, its size and the footer.
//! Output is a pure function of the input: identical calls give identical bytes.

use std::collections::HashSet;
use std::io::Write;

use crate::decode::Hasher;
use crate::validate::{ComponentMeaning, check_meaning, check_roles};
use crate::{ALIGNMENT, DType, Digest, Encoding, FormatError, Location, Object, V1_MAGIC, Value};

/// The manifest version this writer emits.
pub const WRITTEN_VERSION: &str = "1.2.0";

/// Which digest to record for each component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestAlgorithm {
    Crc32c,
    Sha256,
}

impl DigestAlgorithm {
    fn hasher(self) -> Hasher {
        match self {
            DigestAlgorithm::Crc32c => Hasher::for_digest(&Digest::Crc32c(0)),
            DigestAlgorithm::Sha256 => Hasher::for_digest(&Digest::Sha256([0; 32])),
        }
    }
}

/// How components are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOptions {
    /// `None` for raw; `Some(level)` for zstd at that level.
    pub zstd_level: Option<i32>,
    pub digest: Option<DigestAlgorithm>,
}

/// One component to write: its role, types and decoded little-endian bytes.
#[derive(Debug, Clone)]
pub struct ComponentInput<'a> {
    pub role: &'a str,
    pub dtype: DType,
    pub logical_type: Option<&'a str>,
    pub bytes: &'a [u8],
}

/// One object to write.
#[derive(Debug, Clone)]
pub struct ObjectInput<'a> {
    pub name: &'a str,
    pub shape: &'a [u64],
    pub format: &'a str,
    pub attributes: Option<Value>,
    pub components: Vec<ComponentInput<'a>>,
}

/// Why a write was refused.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("object {0:?} was already written")]
    DuplicateObject(String),
    #[error("object {object:?}: component {role:?} appears twice")]
    DuplicateComponent { object: String, role: String },
    /// The object breaks a rule the readers enforce.
    #[error(transparent)]
    Invalid(#[from] FormatError),
    #[error("attributes must be a CBOR map")]
    AttributesNotMap,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Streams a 1.2 file to `out`.
pub struct Writer<W: Write> {
    out: W,
    position: u64,
    names: HashSet<String>,
    objects: Vec<(Value, Value)>,
}

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

fn uint(n: u64) -> Value {
    Value::Integer(n.into())
}

impl<W: Write> Writer<W> {
    /// Starts a file by writing the header magic.
    pub fn new(mut out: W) -> Result<Writer<W>, WriteError> {
        out.write_all(V1_MAGIC)?;
        Ok(Writer { out, position: V1_MAGIC.len() as u64, names: HashSet::new(), objects: Vec::new() })
    }

    /// Writes an object's blobs and records it for the manifest.
    pub fn add(&mut self, object: &ObjectInput<'_>, options: &WriteOptions) -> Result<(), WriteError> {
        if self.names.contains(object.name) {
            return Err(WriteError::DuplicateObject(object.name.to_owned()));
        }
        let meanings: Vec<_> = object
            .components
            .iter()
            .map(|c| ComponentMeaning {
                role: c.role,
                dtype: c.dtype,
                logical_type: c.logical_type,
                encoding: &Encoding::Raw,
                decoded_length: c.bytes.len() as u64,
            })
            .collect();
        check_components(object.name, object.shape, object.format, &meanings)?;
        if object.attributes.as_ref().is_some_and(|a| !matches!(a, Value::Map(_))) {
            return Err(WriteError::AttributesNotMap);
        }
        let mut components = Vec::with_capacity(object.components.len());
        for component in &object.components {
            let entry = self.write_component(component, options)?;
            components.push((text(component.role), entry));
        }
        let entry = object_entry(object.shape, object.format, &object.attributes, components)?;
        self.names.insert(object.name.to_owned());
        self.objects.push((text(object.name), entry));
        Ok(())
    }

    fn write_component(&mut self, component: &ComponentInput<'_>, options: &WriteOptions) -> Result<Value, WriteError> {
        let compressed;
        let (stored, encoding) = match options.zstd_level {
            None => (component.bytes, Encoding::Raw),
            Some(level) => {
                let mut compressor = zstd::bulk::Compressor::new(level)?;
                // A checksum lets any reader catch corruption of the frame itself.
                compressor.include_checksum(true)?;
                compressor.include_contentsize(true)?;
                compressed = compressor.compress(component.bytes)?;
                (compressed.as_slice(), Encoding::Zstd)
            }
        };
        let padding = self.position.next_multiple_of(ALIGNMENT) - self.position;
        self.out.write_all(&[0u8; ALIGNMENT as usize][..padding as usize])?;
        self.position += padding;
        let offset = self.position;
        self.out.write_all(stored)?;
        self.position += stored.len() as u64;

        let digest = options.digest.and_then(|algorithm| {
            let mut hasher = algorithm.hasher();
            hasher.update(stored);
            hasher.finish()
        });
        let entry = StoredComponent {
            role: component.role,
            dtype: component.dtype,
            logical_type: component.logical_type,
            encoding,
            stored_length: stored.len() as u64,
            decoded_length: component.bytes.len() as u64,
            digest,
        };
        Ok(component_entry(&entry, offset))
    }

    /// Writes the manifest, its size and the footer; returns the sink.
    pub fn finish(mut self, attributes: Option<Value>) -> Result<W, WriteError> {
        let tail = manifest_tail(std::mem::take(&mut self.objects), attributes)?;
        self.out.write_all(&tail)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One component whose stored bytes already exist elsewhere (`ztserve pull` fetches them): its
/// encoding, lengths and digest are recorded as they are, never recomputed.
#[derive(Debug, Clone)]
pub struct StoredComponent<'a> {
    pub role: &'a str,
    pub dtype: DType,
    pub logical_type: Option<&'a str>,
    pub encoding: Encoding,
    pub stored_length: u64,
    pub decoded_length: u64,
    pub digest: Option<Digest>,
}

/// One object of a [`plan`]ned file.
#[derive(Debug, Clone)]
pub struct StoredObject<'a> {
    pub name: &'a str,
    pub shape: &'a [u64],
    pub format: &'a str,
    pub attributes: Option<Value>,
    pub components: Vec<StoredComponent<'a>>,
}

pub use crate::model::Plan;

/// Lays out a 1.2 file whose blobs are written by someone else, in any order: the same layout
/// [`Writer`] gives (header magic, blobs in order at 64-byte boundaries, zero padding, then
/// the tail). A file created at `tail_offset + tail.len()` bytes is zero-filled, so writing the
/// header magic, every blob at its offset and the tail at `tail_offset` completes it.
pub fn plan(objects: &[StoredObject<'_>], attributes: Option<Value>) -> Result<Plan, WriteError> {
    let mut names = HashSet::new();
    let mut position = V1_MAGIC.len() as u64;
    let mut offsets = Vec::with_capacity(objects.len());
    let mut entries = Vec::with_capacity(objects.len());
    for object in objects {
        if !names.insert(object.name) {
            return Err(WriteError::DuplicateObject(object.name.to_owned()));
        }
        let meanings: Vec<_> = object
            .components
            .iter()
            .map(|c| ComponentMeaning {
                role: c.role,
                dtype: c.dtype,
                logical_type: c.logical_type,
                encoding: &c.encoding,
                decoded_length: c.decoded_length,
            })
            .collect();
        check_components(object.name, object.shape, object.format, &meanings)?;
        let mut object_offsets = Vec::with_capacity(object.components.len());
        let mut components = Vec::with_capacity(object.components.len());
        for component in &object.components {
            position = position.next_multiple_of(ALIGNMENT);
            object_offsets.push(position);
            components.push((text(component.role), component_entry(component, position)));
            position += component.stored_length;
        }
        offsets.push(object_offsets);
        entries.push((text(object.name), object_entry(object.shape, object.format, &object.attributes, components)?));
    }
    Ok(Plan { offsets, tail_offset: position, tail: manifest_tail(entries, attributes)? })
}

/// A component's manifest map, in the order the official writer emits its keys.
fn component_entry(component: &StoredComponent<'_>, offset: u64) -> Value {
    let mut fields = vec![(text("dtype"), text(component.dtype.name()))];
    if let Some(logical) = component.logical_type {
        fields.push((text("type"), text(logical)));
    }
    fields.push((text("offset"), uint(offset)));
    fields.push((text("length"), uint(component.stored_length)));
    if component.encoding == Encoding::Zstd {
        fields.push((text("uncompressed_length"), uint(component.decoded_length)));
        fields.push((text("encoding"), text("zstd")));
    }
    if let Some(digest) = &component.digest {
        fields.push((text("digest"), text(&digest.to_string())));
    }
    Value::Map(fields)
}

fn object_entry(
    shape: &[u64],
    format: &str,
    attributes: &Option<Value>,
    components: Vec<(Value, Value)>,
) -> Result<Value, WriteError> {
    let mut fields =
        vec![(text("shape"), Value::Array(shape.iter().map(|&d| uint(d)).collect())), (text("format"), text(format))];
    if let Some(attributes) = attributes {
        if !matches!(attributes, Value::Map(_)) {
            return Err(WriteError::AttributesNotMap);
        }
        fields.push((text("attributes"), attributes.clone()));
    }
    fields.push((text("components"), Value::Map(components)));
    Ok(Value::Map(fields))
}

/// The manifest, its size and the footer magic.
fn manifest_tail(objects: Vec<(Value, Value)>, attributes: Option<Value>) -> Result<Vec<u8>, WriteError> {
    let mut root = vec![(text("version"), text(WRITTEN_VERSION))];
    if let Some(attributes) = attributes {
        if !matches!(attributes, Value::Map(_)) {
            return Err(WriteError::AttributesNotMap);
        }
        root.push((text("attributes"), attributes));
    }
    root.push((text("objects"), Value::Map(objects)));
    let mut tail = Vec::new();
    ciborium::ser::into_writer(&Value::Map(root), &mut tail).map_err(|e| std::io::Error::other(e.to_string()))?;
    let size = tail.len() as u64;
    tail.extend_from_slice(&size.to_le_bytes());
    tail.extend_from_slice(V1_MAGIC);
    Ok(tail)
}

/// Refuses objects the reader would refuse, so this writer never produces a broken file: the
/// readers' own rules on each component's meaning and on required components, plus roles
/// named once.
fn check_components(
    name: &str,
    shape: &[u64],
    format: &str,
    components: &[ComponentMeaning<'_>],
) -> Result<(), WriteError> {
    let mut roles = HashSet::new();
    for component in components {
        if !roles.insert(component.role) {
            return Err(WriteError::DuplicateComponent { object: name.to_owned(), role: component.role.to_owned() });
        }
    }
    let object = Object {
        name: name.to_owned(),
        shape: shape.to_vec(),
        format: format.to_owned(),
        attributes: None,
        components: Vec::new(),
    };
    let elements = object.element_count();
    for component in components {
        check_meaning(&object, elements, component, &Location::component(name, component.role))?;
    }
    check_roles(name, format, components.iter().map(|c| c.role))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn add(format: &str, shape: &[u64], components: Vec<ComponentInput<'_>>) -> Result<(), WriteError> {
        let object = ObjectInput { name: "w", shape, format, attributes: None, components };
        Writer::new(Vec::new()).unwrap().add(&object, &WriteOptions::default())
    }

    fn data<'a>(dtype: DType, logical_type: Option<&'a str>, bytes: &'a [u8]) -> ComponentInput<'a> {
        ComponentInput { role: "data", dtype, logical_type, bytes }
    }

    #[test]
    fn the_writer_refuses_what_the_readers_refuse_with_the_readers_own_codes() {
        let code = |result: Result<(), WriteError>| match result {
            Err(WriteError::Invalid(e)) => e.code(),
            Err(WriteError::DuplicateComponent { .. }) => "duplicate_component",
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(add("dense", &[2], vec![data(DType::F32, Some("f8_e4m3fn"), &[0; 8])])),
            "logical_type_mismatch"
        );
        assert_eq!(code(add("dense", &[3], vec![data(DType::F32, None, &[0; 8])])), "length_mismatch");
        assert_eq!(code(add("dense", &[2], vec![data(DType::F32, None, &[0; 7])])), "length_not_multiple");
        assert_eq!(code(add("sparse_csr", &[2, 2], vec![data(DType::F32, None, &[0; 8])])), "missing_component");
        let twice = vec![data(DType::U8, None, &[1]), data(DType::U8, None, &[1])];
        assert_eq!(code(add("dense", &[1], twice)), "duplicate_component");
        assert!(add("dense", &[4], vec![data(DType::F32, Some("complex64"), &[0; 32])]).is_ok());
    }
}
