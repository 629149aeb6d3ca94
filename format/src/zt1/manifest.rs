//! The `ZTEN1000` manifest: a CBOR map of `version`, `attributes` and `objects`, read into the
//! generation-neutral model. Accepts what the official 1.1.1 and 1.2.3 writers emit, including
//! omitted `encoding` and `uncompressed_length`, and 1.1's compound dtype names.

use std::ops::Range;

use crate::cbor::Fields;
use crate::{
    ByteOrder, Component, Container, DType, Digest, DigestScope, Encoding, FormatError, Location, Manifest, Object,
    Result, Value,
};

pub(super) fn parse(root: Value, span: Range<u64>, file_len: u64) -> Result<Manifest> {
    let fields = Fields::of(&root, "manifest")?;
    let version = fields.required_text("version")?;
    let major = version.split('.').next().unwrap_or("");
    if major != "1" {
        return Err(FormatError::UnsupportedVersion { version: version.to_owned() });
    }
    let attributes = attributes(&fields)?;
    let objects_value = fields.require("objects")?;
    let object_map = Fields::of(objects_value, "manifest.objects")?;
    let Value::Map(raw_entries) = objects_value else { unreachable!("Fields::of checked the map") };
    if object_map.entries().count() != raw_entries.len() {
        return Err(object_map.wrong("<key>", "text object names"));
    }
    // 1.1.0's compound dtype names are read only where 1.1 defined them: ztensor 1.2.3 refuses
    // them in a 1.2 manifest, and so do we.
    let spelling = if version.split('.').nth(1) == Some("1") { Spelling::V1_1 } else { Spelling::V1_2 };
    let objects =
        object_map.entries().map(|(name, value)| object(name, value, spelling)).collect::<Result<Vec<_>>>()?;
    Manifest::new(Container::V1, Some(version.to_owned()), attributes, objects, span, file_len)
}

/// `attributes` of the file or an object: a map whose values may be any CBOR.
pub(super) fn attributes(fields: &Fields<'_>) -> Result<Option<Value>> {
    match fields.get("attributes") {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Map(_)) => Ok(Some(v.clone())),
        Some(_) => Err(fields.wrong("attributes", "a map")),
    }
}

/// Which 1.x dtype names a manifest may use.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// 1.1.x: the short names and the compound ones (`f8_e4m3`, `complex64`, ...).
    V1_1,
    /// 1.2 and later: the short storage names only, the logical type apart.
    V1_2,
}

fn object(name: &str, value: &Value, spelling: Spelling) -> Result<Object> {
    let fields = Fields::of(value, format!("object {name:?}"))?;
    let shape = fields.uint_array("shape")?;
    let format = fields.required_text("format")?.to_owned();
    let attributes = attributes(&fields)?;
    let components_value = fields.require("components")?;
    let component_map = Fields::of(components_value, format!("object {name:?}.components"))?;
    let mut object = Object { name: name.to_owned(), shape, format, attributes, components: Vec::new() };
    let elements = object.element_count();
    for (role, value) in component_map.entries() {
        let component = component(&object, elements, role, value, spelling)?;
        object.components.push(component);
    }
    Ok(object)
}

fn component(
    object: &Object,
    elements: Option<u64>,
    role: &str,
    value: &Value,
    spelling: Spelling,
) -> Result<Component> {
    let at = Location::component(&object.name, role);
    let fields = Fields::of(value, at.to_string())?;
    let dtype_name = fields.required_text("dtype")?;
    let (dtype, implied_type) = parse_dtype(dtype_name, spelling)
        .ok_or_else(|| FormatError::UnknownDtype { at: at.clone(), dtype: dtype_name.to_owned() })?;
    let logical_type = fields.text("type")?.map(str::to_owned).or(implied_type.map(str::to_owned));
    let offset = fields.required_uint("offset")?;
    let stored_length = fields.required_uint("length")?;
    let encoding = match fields.text("encoding")? {
        None | Some("raw") => Encoding::Raw,
        Some("zstd") => Encoding::Zstd,
        Some(other) => return Err(FormatError::UnknownEncoding { at, encoding: other.to_owned() }),
    };
    let digest = match fields.text("digest")? {
        None => None,
        Some(text) => Some(Digest::parse(text).ok_or_else(|| FormatError::BadDigest {
            at: at.clone(),
            digest: text.to_owned(),
            expected: "\"crc32c:0x<8 hex>\" or \"sha256:<64 hex>\"",
        })?),
    };
    let declared = fields.uint("uncompressed_length")?;
    let mut component = Component {
        role: role.to_owned(),
        dtype,
        logical_type,
        offset,
        stored_length,
        encoding,
        decoded_length: 0,
        digest,
        digest_scope: DigestScope::Stored,
        byte_order: ByteOrder::Little,
        file: 0,
    };
    component.decoded_length = decoded_length(object, elements, &component, declared, &at)?;
    Ok(component)
}

/// 1.x short names, plus, in 1.1 manifests, the 1.1.0 spec's compound and FP8 dtype names,
/// which are normalised to their 1.2 storage dtype and logical type (the byte layout is
/// identical).
fn parse_dtype(name: &str, spelling: Spelling) -> Option<(DType, Option<&'static str>)> {
    if let Some(dtype) = DType::from_name(name) {
        return Some((dtype, None));
    }
    if spelling != Spelling::V1_1 {
        return None;
    }
    match name {
        "f8_e4m3" => Some((DType::U8, Some("f8_e4m3fn"))),
        "f8_e5m2" => Some((DType::U8, Some("f8_e5m2"))),
        "complex64" => Some((DType::F32, Some("complex64"))),
        "complex128" => Some((DType::F64, Some("complex128"))),
        _ => None,
    }
}

/// The decoded size of a component: declared, or for a raw component its stored length, or
/// for a zstd dense `data` component without a declaration (1.1.1 files) the shape's size.
/// Its limit is checked with the other structural rules, after the bounds.
pub(super) fn decoded_length(
    object: &Object,
    elements: Option<u64>,
    component: &Component,
    declared: Option<u64>,
    at: &Location,
) -> Result<u64> {
    let size = match (&component.encoding, declared) {
        (Encoding::Raw, Some(declared)) if declared != component.stored_length => {
            return Err(FormatError::LengthMismatch {
                at: at.clone(),
                what: "uncompressed_length of a raw component",
                expected: component.stored_length,
                actual: declared,
            });
        }
        (Encoding::Raw, _) => component.stored_length,
        (Encoding::Zstd, None) if is_dense_data(object, component) => dense_size(object, elements, component, at)?,
        (_, None) => return Err(FormatError::UnknownDecodedLength { at: at.clone() }),
        (_, Some(declared)) => declared,
    };
    Ok(size)
}

pub(super) fn is_dense_data(object: &Object, component: &Component) -> bool {
    object.format == "dense" && component.role == "data"
}

/// `product(shape) × ratio × width`, the size a dense `data` component must have.
pub(super) fn dense_size(object: &Object, elements: Option<u64>, component: &Component, at: &Location) -> Result<u64> {
    elements
        .and_then(|n| n.checked_mul(component.logical_ratio()))
        .and_then(|n| n.checked_mul(component.dtype.width()))
        .ok_or_else(|| FormatError::ShapeOverflow { at: at.clone(), shape: object.shape.clone() })
}
