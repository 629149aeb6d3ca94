//! The registered logical types of v2 (Appendix A) and their sizes, and the metadata rules of
//! the layouts this reader interprets (`dense`, `zt.sparse_csr/1`, `zt.sparse_coo/1`,
//! `zt.quant_group/1`): the parts each must have and the decoded size of each.

use crate::cbor::Fields;
use crate::{Component, DType, FormatError, Location, Object, Result, Value};

/// What a registered logical type (Appendix A) requires: its storage dtype, and the decoded
/// size of `n` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogicalSize {
    /// `n × width(dtype) × k`: plain byte-wide types (k = 1) and complex ones (k = 2).
    PerElement(u64),
    /// `⌈n / 2⌉`: two 4-bit elements per byte, low nibble first.
    Nibbles,
}

impl LogicalSize {
    pub fn bytes(self, dtype: DType, elements: u64) -> Option<u64> {
        match self {
            LogicalSize::PerElement(k) => elements.checked_mul(dtype.width())?.checked_mul(k),
            LogicalSize::Nibbles => Some(elements.div_ceil(2)),
        }
    }
}

/// The registered logical types of v2 (Appendix A); `None` for any other name.
pub fn logical_size(name: &str) -> Option<(DType, LogicalSize)> {
    match name {
        "bool" | "f8_e4m3fn" | "f8_e5m2" | "f8_e4m3fnuz" | "f8_e5m2fnuz" | "f8_e8m0" => {
            Some((DType::U8, LogicalSize::PerElement(1)))
        }
        "f4_e2m1" => Some((DType::U8, LogicalSize::Nibbles)),
        "complex64" => Some((DType::F32, LogicalSize::PerElement(2))),
        "complex128" => Some((DType::F64, LogicalSize::PerElement(2))),
        _ => None,
    }
}

/// The decoded size `elements` of this part's type take, when its type is known (a part
/// without `type` is its dtype); `None` for an unregistered logical type.
fn size_of(component: &Component, elements: u64) -> Option<Option<u64>> {
    match component.logical_type.as_deref() {
        None => Some(elements.checked_mul(component.dtype.width())),
        Some(name) => logical_size(name).map(|(_, size)| size.bytes(component.dtype, elements)),
    }
}

fn layout_error(object: &Object, detail: impl Into<String>) -> FormatError {
    FormatError::LayoutRule { at: Location::object(&object.name), layout: object.format.clone(), detail: detail.into() }
}

/// The parts are exactly `roles`, in any order.
fn exact_parts(object: &Object, roles: &[&str]) -> Result<()> {
    let mut present: Vec<&str> = object.components.iter().map(|c| c.role.as_str()).collect();
    present.sort_unstable();
    let mut wanted = roles.to_vec();
    wanted.sort_unstable();
    if present != wanted {
        return Err(layout_error(object, format!("parts must be exactly {wanted:?}, found {present:?}")));
    }
    Ok(())
}

pub(super) fn part_of<'o>(object: &'o Object, role: &str) -> &'o Component {
    object.component(role).expect("exact_parts checked the roles")
}

fn expect_size(object: &Object, component: &Component, what: &'static str, expected: Option<u64>) -> Result<()> {
    let at = Location::component(&object.name, &component.role);
    let expected =
        expected.ok_or_else(|| FormatError::ShapeOverflow { at: at.clone(), shape: object.shape.clone() })?;
    if component.decoded_length != expected {
        return Err(FormatError::LengthMismatch { at, what, expected, actual: component.decoded_length });
    }
    Ok(())
}

/// A sparse index part: plain `u32` or `u64`.
fn index_width(object: &Object, component: &Component) -> Result<u64> {
    match (component.dtype, &component.logical_type) {
        (DType::U32 | DType::U64, None) => Ok(component.dtype.width()),
        _ => Err(layout_error(
            object,
            format!("part {:?} must be plain u32 or u64, found {}", component.role, describe_type(component)),
        )),
    }
}

fn describe_type(component: &Component) -> String {
    match &component.logical_type {
        Some(t) => format!("{} with type {t:?}", component.dtype),
        None => component.dtype.to_string(),
    }
}

/// The metadata rules of the layouts this reader interprets; any other layout is structural.
pub(super) fn check_layout(object: &Object) -> Result<()> {
    let elements = object.element_count().expect("checked before the parts");
    match object.format.as_str() {
        "dense" => {
            exact_parts(object, &["data"])?;
            let data = part_of(object, "data");
            match size_of(data, elements) {
                Some(size) => expect_size(object, data, "decoded size of dense data", size),
                None => Ok(()),
            }
        }
        "zt.sparse_csr/1" => {
            exact_parts(object, &["values", "indices", "indptr"])?;
            let [rows, _] = object.shape[..] else {
                return Err(layout_error(object, format!("needs rank 2, found shape {:?}", object.shape)));
            };
            let (indices, indptr, values) =
                (part_of(object, "indices"), part_of(object, "indptr"), part_of(object, "values"));
            let width = index_width(object, indices)?;
            index_width(object, indptr)?;
            if indptr.dtype != indices.dtype {
                return Err(layout_error(object, "indptr and indices must have the same dtype"));
            }
            expect_size(
                object,
                indptr,
                "decoded size of indptr",
                rows.checked_add(1).and_then(|r| r.checked_mul(width)),
            )?;
            let nnz = whole_count(object, indices, width)?;
            check_values(object, values, nnz)
        }
        "zt.sparse_coo/1" => {
            exact_parts(object, &["values", "coords"])?;
            if object.shape.is_empty() {
                return Err(layout_error(object, "needs rank 1 or more"));
            }
            let (coords, values) = (part_of(object, "coords"), part_of(object, "values"));
            let width = index_width(object, coords)?;
            let per_element = width * object.shape.len() as u64;
            let nnz = whole_count(object, coords, per_element)?;
            check_values(object, values, nnz)
        }
        "zt.quant_group/1" => check_quant_group(object, elements),
        _ => Ok(()),
    }
}

/// `decoded_size / unit`, which must divide exactly.
fn whole_count(object: &Object, component: &Component, unit: u64) -> Result<u64> {
    if component.decoded_length % unit != 0 {
        return Err(FormatError::LengthNotMultiple {
            at: Location::component(&object.name, &component.role),
            length: component.decoded_length,
            width: unit,
        });
    }
    Ok(component.decoded_length / unit)
}

fn check_values(object: &Object, values: &Component, nnz: u64) -> Result<()> {
    match size_of(values, nnz) {
        Some(size) => expect_size(object, values, "decoded size of values (nnz elements)", size),
        None => Ok(()),
    }
}

/// `zt.quant_group/1`: a parametric profile whose attributes state every decoder parameter.
fn check_quant_group(object: &Object, elements: u64) -> Result<()> {
    let fail = |detail: String| Err(layout_error(object, detail));
    let attrs = match &object.attributes {
        Some(attrs) => Fields::of(attrs, format!("object {:?}.attributes", object.name))?,
        None => return fail("needs the attributes bits, group_size, axis, packing, scale_form, zero_point".into()),
    };
    let bits = attrs.required_uint("bits")?;
    let group_size = attrs.required_uint("group_size")?;
    let axis = attrs.required_uint("axis")?;
    let packing = Fields::of(attrs.require("packing")?, "attributes.packing")?;
    let word_name = packing.required_text("word")?;
    let order = packing.required_text("order")?;
    let per_word = packing.required_uint("per_word")?;
    let scale_form = attrs.required_text("scale_form")?;
    let zero_point = Fields::of(attrs.require("zero_point")?, "attributes.zero_point")?;
    let form = zero_point.required_text("form")?;
    let has_zeros = match form {
        "none" => false,
        "implied" => {
            if !matches!(zero_point.get("value"), Some(Value::Integer(_))) {
                return fail("zero_point.form \"implied\" needs an integer zero_point.value".into());
            }
            false
        }
        "tensor" => true,
        other => return fail(format!("zero_point.form {other:?} is not none, implied or tensor")),
    };
    exact_parts(object, if has_zeros { &["data", "scales", "zeros"] } else { &["data", "scales"] })?;
    let (data, scales) = (part_of(object, "data"), part_of(object, "scales"));
    let word = match word_name {
        "u8" => DType::U8,
        "u16" => DType::U16,
        "u32" => DType::U32,
        "u64" => DType::U64,
        other => return fail(format!("packing.word {other:?} is not u8, u16, u32 or u64")),
    };
    let unsigned_of_data = match data.dtype {
        DType::I8 => DType::U8,
        DType::I16 => DType::U16,
        DType::I32 => DType::U32,
        DType::I64 => DType::U64,
        d => d,
    };
    if data.logical_type.is_some() || unsigned_of_data != word {
        return fail(format!("data must be plain {word_name} (or its signed twin), found {}", describe_type(data)));
    }
    if !matches!(order, "lsb_first" | "msb_first") {
        return fail(format!("packing.order {order:?} is not lsb_first or msb_first"));
    }
    let word_bits = 8 * word.width();
    if !matches!(bits, 2..=6 | 8) || word_bits % bits != 0 || per_word != word_bits / bits {
        return fail(format!("bits {bits} and per_word {per_word} do not pack a {word_bits}-bit word exactly"));
    }
    match scale_form {
        "f32_factors" | "f16_factors" if matches!(scales.dtype, DType::F64 | DType::F32 | DType::F16 | DType::BF16) => {
        }
        "e8m0_exponent" if scales.dtype == DType::U8 && scales.logical_type.as_deref() == Some("f8_e8m0") => {}
        "f32_factors" | "f16_factors" | "e8m0_exponent" => {
            return fail(format!("scales ({}) do not suit scale_form {scale_form:?}", describe_type(scales)));
        }
        other => return fail(format!("scale_form {other:?} is not registered")),
    }
    let rank = object.shape.len() as u64;
    if axis >= rank {
        return fail(format!("axis {axis} is not below the rank {rank}"));
    }
    let along = object.shape[axis as usize];
    if group_size != 0 && along % group_size != 0 {
        return fail(format!("group_size {group_size} does not divide shape[{axis}] = {along}"));
    }
    let groups = along.checked_div(group_size).unwrap_or(along);
    let lanes = elements.checked_div(along).unwrap_or(0);
    let group_count = groups.checked_mul(lanes);
    if elements % per_word != 0 {
        return fail(format!("{elements} codes do not fill whole {per_word}-code words"));
    }
    expect_size(object, data, "decoded size of packed data", (elements / per_word).checked_mul(word.width()))?;
    expect_size(
        object,
        scales,
        "decoded size of scales",
        group_count.and_then(|g| g.checked_mul(scales.dtype.width())),
    )?;
    if has_zeros {
        let zeros = part_of(object, "zeros");
        let expected = match zero_point.required_text("packing")? {
            "plain" => group_count.and_then(|g| g.checked_mul(zeros.dtype.width())),
            "same_as_data" => group_count.map(|g| g / per_word).and_then(|w| w.checked_mul(word.width())),
            other => return fail(format!("zero_point.packing {other:?} is not plain or same_as_data")),
        };
        expect_size(object, zeros, "decoded size of zeros", expected)?;
    }
    Ok(())
}
