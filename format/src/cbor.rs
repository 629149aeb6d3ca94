//! Bounded CBOR decoding and strict field access. The `Value` tree is built from item headers
//! pulled with `ciborium-ll`, iteratively, so a hostile manifest is refused for its depth, item
//! count, declared lengths or trailing bytes without recursing or allocating for what it merely
//! claims; maps are then checked for duplicate keys. Tags stay tags: `ciborium`'s serde path
//! would turn a bignum into a plain integer and let it pass where an unsigned integer belongs.

use std::collections::HashSet;

use ciborium::Value;
use ciborium_ll::{Decoder, Header};

use super::{FormatError, Limits, Result};

/// Which encodings a manifest may use beyond well-formed CBOR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rules {
    /// RFC 8949 §4.2.1 core deterministic encoding, and no tags.
    deterministic: bool,
}

impl Rules {
    /// Any well-formed CBOR (the 0.1 and 1.x manifests).
    pub(super) const ANY: Rules = Rules { deterministic: false };
    /// Deterministic encoding without tags (zTensor v2 §3.1).
    pub(super) const DETERMINISTIC: Rules = Rules { deterministic: true };
}

/// Decodes exactly one CBOR item filling `bytes`, within `limits` and `rules`. Tags are kept
/// as tags (bignums are not turned into integers), so a tagged value is never mistaken for a
/// plain one.
pub(super) fn decode(bytes: &[u8], limits: &Limits, rules: Rules) -> Result<Value> {
    let value = build(bytes, limits, rules)?;
    check_duplicate_keys(&value, "manifest")?;
    Ok(value)
}

/// `value` in deterministic CBOR (RFC 8949 §4.2.1): map keys sorted by their encoded bytes at
/// every level; `ciborium` already writes shortest heads and the narrowest exact float (NaN as
/// `f9 7e 00`). `value` must hold no tags.
pub(super) fn encode_deterministic(value: &Value) -> Vec<u8> {
    fn encoded(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::ser::into_writer(value, &mut out).expect("encoding to memory cannot fail");
        out
    }
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Map(entries) => {
                let mut entries: Vec<(Vec<u8>, Value, Value)> =
                    entries.iter().map(|(k, v)| (encoded(k), sorted(k), sorted(v))).collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                Value::Map(entries.into_iter().map(|(_, k, v)| (k, v)).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    encoded(&sorted(value))
}

/// A container being filled.
enum Open {
    Array {
        items: Vec<Value>,
        left: Option<u64>,
    },
    Map {
        entries: Vec<(Value, Value)>,
        key: Option<Value>,
        left: Option<u64>,
        /// Where the key being read, and the previous key, are encoded (deterministic rules).
        key_start: usize,
        previous_key: Option<std::ops::Range<usize>>,
    },
    Tag(u64),
    /// An indefinite byte or text string: definite chunks of the same major type, then a break.
    Chunks {
        text: bool,
        bytes: Vec<u8>,
    },
}

/// Walks the item headers iteratively (depth never reaches the call stack), checking every
/// declared length against the remaining input before reading or allocating for it.
fn build(bytes: &[u8], limits: &Limits, rules: Rules) -> Result<Value> {
    let mut decoder = Decoder::from(bytes);
    let mut open: Vec<Open> = Vec::new();
    let mut items: u64 = 0;
    loop {
        let offset = decoder.offset();
        if let Some(Open::Map { key: None, key_start, .. }) = open.last_mut() {
            *key_start = offset;
        }
        let header = decoder.pull().map_err(|e| cbor_error(e, offset))?;
        if rules.deterministic {
            check_deterministic_head(&header, &bytes[offset..decoder.offset()], offset)?;
        }
        let remaining = (bytes.len() - decoder.offset()) as u64;
        items += 1;
        if items > limits.max_cbor_items {
            return Err(FormatError::CborTooManyItems { limit: limits.max_cbor_items });
        }
        if let Some(Open::Chunks { text, bytes: chunks }) = open.last_mut() {
            let chunk = match (header, *text) {
                (Header::Break, _) => None,
                (Header::Bytes(Some(len)), false) | (Header::Text(Some(len)), true) => Some(len),
                _ => {
                    return Err(FormatError::CborInvalid {
                        offset,
                        detail: "indefinite string holds something other than a definite chunk".into(),
                    });
                }
            };
            match chunk {
                Some(len) => chunks.extend_from_slice(&read_payload(&mut decoder, len, offset, bytes.len())?),
                None => {
                    let Some(Open::Chunks { text, bytes: whole }) = open.pop() else { unreachable!() };
                    let value = if text { Value::Text(utf8(whole, offset)?) } else { Value::Bytes(whole) };
                    if let Some(root) = complete(&mut open, value, offset, bytes, rules)? {
                        return finish(root, &mut decoder, bytes.len());
                    }
                }
            }
            continue;
        }
        let value = match header {
            Header::Positive(n) => Value::Integer(n.into()),
            Header::Negative(n) => Value::Integer(
                ciborium::value::Integer::try_from(-1 - i128::from(n)).expect("CBOR negatives fit in 65 bits"),
            ),
            Header::Float(f) => Value::Float(f),
            Header::Simple(20) => Value::Bool(false),
            Header::Simple(21) => Value::Bool(true),
            Header::Simple(22) | Header::Simple(23) => Value::Null,
            Header::Simple(n) => {
                return Err(FormatError::CborInvalid { offset, detail: format!("unassigned simple value {n}") });
            }
            Header::Break => match open.last() {
                Some(Open::Array { left: None, .. }) => {
                    let Some(Open::Array { items, .. }) = open.pop() else { unreachable!() };
                    Value::Array(items)
                }
                Some(Open::Map { left: None, key: None, .. }) => {
                    let Some(Open::Map { entries, .. }) = open.pop() else { unreachable!() };
                    Value::Map(entries)
                }
                _ => return Err(FormatError::CborInvalid { offset, detail: "unexpected break".into() }),
            },
            Header::Bytes(Some(len)) => Value::Bytes(read_payload(&mut decoder, len, offset, bytes.len())?),
            Header::Text(Some(len)) => {
                Value::Text(utf8(read_payload(&mut decoder, len, offset, bytes.len())?, offset)?)
            }
            Header::Bytes(None) | Header::Text(None) => {
                open.push(Open::Chunks { text: matches!(header, Header::Text(_)), bytes: Vec::new() });
                check_depth(&open, limits)?;
                continue;
            }
            Header::Tag(tag) => {
                open.push(Open::Tag(tag));
                check_depth(&open, limits)?;
                continue;
            }
            Header::Array(len) | Header::Map(len) => {
                let is_map = matches!(header, Header::Map(_));
                let left = match len {
                    None => None,
                    Some(n) => {
                        let count = (n as u64).saturating_mul(if is_map { 2 } else { 1 });
                        // Every item takes at least one byte, so a count above what remains is a lie.
                        if count > remaining {
                            return Err(FormatError::CborLengthBeyondInput { offset, declared: n as u64, remaining });
                        }
                        Some(count)
                    }
                };
                if left == Some(0) {
                    if is_map { Value::Map(Vec::new()) } else { Value::Array(Vec::new()) }
                } else {
                    open.push(if is_map {
                        Open::Map { entries: Vec::new(), key: None, left, key_start: 0, previous_key: None }
                    } else {
                        Open::Array { items: Vec::new(), left }
                    });
                    check_depth(&open, limits)?;
                    continue;
                }
            }
        };
        if let Some(root) = complete(&mut open, value, decoder.offset(), bytes, rules)? {
            return finish(root, &mut decoder, bytes.len());
        }
    }
}

/// The encoding rules of RFC 8949 §4.2.1 a single item head must meet: the shortest head for
/// its argument, a definite length, no tag, and a float in the narrowest width that holds it
/// exactly (NaN only as `f9 7e 00`).
fn check_deterministic_head(header: &Header, head: &[u8], offset: usize) -> Result<()> {
    let fail = |detail: &str| Err(FormatError::CborNotDeterministic { offset, detail: detail.into() });
    let argument = match *header {
        Header::Positive(n) | Header::Negative(n) => n,
        Header::Bytes(Some(n)) | Header::Text(Some(n)) | Header::Array(Some(n)) | Header::Map(Some(n)) => n as u64,
        Header::Simple(n) => u64::from(n),
        Header::Tag(_) => return fail("tags are not allowed"),
        Header::Break | Header::Bytes(None) | Header::Text(None) | Header::Array(None) | Header::Map(None) => {
            return fail("indefinite length");
        }
        Header::Float(f) => {
            let shortest = if f.is_nan() {
                return if head == [0xf9, 0x7e, 0x00] { Ok(()) } else { fail("NaN not encoded as f9 7e 00") };
            } else if half::f16::from_f64(f).to_f64().to_bits() == f.to_bits() {
                3
            } else if f64::from(f as f32).to_bits() == f.to_bits() {
                5
            } else {
                9
            };
            return if head.len() == shortest { Ok(()) } else { fail("float wider than its value needs") };
        }
    };
    let shortest = match argument {
        0..24 => 1,
        24..=0xff => 2,
        0x100..=0xffff => 3,
        0x1_0000..=0xffff_ffff => 5,
        _ => 9,
    };
    if head.len() != shortest {
        return fail("integer or length not in its shortest form");
    }
    Ok(())
}

fn check_depth(open: &[Open], limits: &Limits) -> Result<()> {
    if open.len() > limits.max_cbor_depth {
        return Err(FormatError::CborTooDeep { limit: limits.max_cbor_depth });
    }
    Ok(())
}

/// Places a finished value in the innermost open container, closing every container this
/// completes. Returns the root once the top-level item is complete.
/// `end` is where `value`'s encoding ends in `bytes`, for the key order of deterministic rules.
fn complete(open: &mut Vec<Open>, mut value: Value, end: usize, bytes: &[u8], rules: Rules) -> Result<Option<Value>> {
    let offset = end;
    loop {
        let done = match open.last_mut() {
            None => return Ok(Some(value)),
            Some(Open::Tag(tag)) => {
                value = Value::Tag(*tag, Box::new(value));
                open.pop();
                continue;
            }
            Some(Open::Array { items, left }) => {
                items.push(value);
                decrement(left)
            }
            Some(Open::Map { entries, key, left, key_start, previous_key }) => {
                match key.take() {
                    None => {
                        if rules.deterministic {
                            let this = *key_start..end;
                            if previous_key.as_ref().is_some_and(|p| bytes[p.clone()] >= bytes[this.clone()]) {
                                return Err(FormatError::CborNotDeterministic {
                                    offset: *key_start,
                                    detail: "map keys not in strictly ascending bytewise order".into(),
                                });
                            }
                            *previous_key = Some(this);
                        }
                        *key = Some(value)
                    }
                    Some(k) => entries.push((k, value)),
                }
                decrement(left)
            }
            Some(Open::Chunks { .. }) => {
                return Err(FormatError::CborInvalid { offset, detail: "item inside an indefinite string".into() });
            }
        };
        if !done {
            return Ok(None);
        }
        value = match open.pop() {
            Some(Open::Array { items, .. }) => Value::Array(items),
            Some(Open::Map { entries, .. }) => Value::Map(entries),
            _ => unreachable!("only arrays and maps count down"),
        };
    }
}

/// Counts one item of a definite container; true when it is full.
fn decrement(left: &mut Option<u64>) -> bool {
    match left {
        Some(n) => {
            *n -= 1;
            *n == 0
        }
        None => false,
    }
}

fn finish(root: Value, decoder: &mut Decoder<&[u8]>, total: usize) -> Result<Value> {
    let trailing = total - decoder.offset();
    if trailing > 0 {
        return Err(FormatError::CborTrailingBytes { count: trailing });
    }
    Ok(root)
}

fn utf8(bytes: Vec<u8>, offset: usize) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| FormatError::CborInvalid { offset, detail: "text string is not UTF-8".into() })
}

fn read_payload(decoder: &mut Decoder<&[u8]>, len: usize, offset: usize, total: usize) -> Result<Vec<u8>> {
    let remaining = total - decoder.offset();
    if len > remaining {
        return Err(FormatError::CborLengthBeyondInput { offset, declared: len as u64, remaining: remaining as u64 });
    }
    let mut payload = vec![0u8; len];
    ciborium_io::Read::read_exact(decoder, &mut payload)
        .map_err(|_| FormatError::CborInvalid { offset, detail: "unexpected end of input".into() })?;
    Ok(payload)
}

fn cbor_error<E: std::fmt::Debug>(error: ciborium_ll::Error<E>, offset: usize) -> FormatError {
    match error {
        ciborium_ll::Error::Syntax(at) => {
            FormatError::CborInvalid { offset: at, detail: "malformed item header".into() }
        }
        ciborium_ll::Error::Io(_) => FormatError::CborInvalid { offset, detail: "unexpected end of input".into() },
    }
}

/// A map key in a form that can be hashed: text keys as themselves, any other key by its
/// canonical encoding.
#[derive(PartialEq, Eq, Hash)]
enum KeyRef<'a> {
    Text(&'a str),
    Other(Vec<u8>),
}

fn check_duplicate_keys(value: &Value, context: &str) -> Result<()> {
    // Iterative, so depth is bounded by the pre-scan and never by the stack.
    let mut pending: Vec<&Value> = vec![value];
    while let Some(v) = pending.pop() {
        match v {
            Value::Map(entries) => {
                let mut seen = HashSet::with_capacity(entries.len());
                for (k, val) in entries {
                    let key = match k {
                        Value::Text(t) => KeyRef::Text(t),
                        other => {
                            let mut buf = Vec::new();
                            ciborium::ser::into_writer(other, &mut buf).expect("encoding to memory cannot fail");
                            KeyRef::Other(buf)
                        }
                    };
                    if !seen.insert(key) {
                        return Err(FormatError::DuplicateKey { context: context.to_owned(), key: describe_key(k) });
                    }
                    pending.push(k);
                    pending.push(val);
                }
            }
            Value::Array(items) => pending.extend(items.iter()),
            Value::Tag(_, inner) => pending.push(inner),
            _ => {}
        }
    }
    Ok(())
}

fn describe_key(key: &Value) -> String {
    match key {
        Value::Text(t) => format!("{t:?}"),
        other => format!("{other:?}"),
    }
}

/// A CBOR map's entries by text key, for strict typed access.
pub(super) struct Fields<'a> {
    context: String,
    entries: Vec<(&'a str, &'a Value)>,
}

impl<'a> Fields<'a> {
    /// Views `value` as a map with text keys. Non-text keys are unknown fields: ignored.
    pub(crate) fn of(value: &'a Value, context: impl Into<String>) -> Result<Fields<'a>> {
        let context = context.into();
        let Value::Map(map) = value else {
            return Err(FormatError::WrongShape { context, expected: "a map" });
        };
        let entries = map.iter().filter_map(|(k, v)| k.as_text().map(|k| (k, v))).collect();
        Ok(Fields { context, entries })
    }

    pub(crate) fn get(&self, field: &str) -> Option<&'a Value> {
        self.entries.iter().find(|(k, _)| *k == field).map(|(_, v)| *v)
    }

    pub(crate) fn entries(&self) -> impl Iterator<Item = (&'a str, &'a Value)> + '_ {
        self.entries.iter().copied()
    }

    pub(crate) fn require(&self, field: &'static str) -> Result<&'a Value> {
        self.get(field).ok_or_else(|| FormatError::MissingField { context: self.context.clone(), field })
    }

    pub(crate) fn text(&self, field: &'static str) -> Result<Option<&'a str>> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Text(t)) => Ok(Some(t)),
            Some(_) => Err(self.wrong(field, "a text string")),
        }
    }

    pub(crate) fn required_text(&self, field: &'static str) -> Result<&'a str> {
        self.text(field)?.ok_or_else(|| FormatError::MissingField { context: self.context.clone(), field })
    }

    pub(crate) fn uint(&self, field: &'static str) -> Result<Option<u64>> {
        self.get(field).map(|v| unsigned(v, &self.context, field)).transpose()
    }

    pub(crate) fn required_uint(&self, field: &'static str) -> Result<u64> {
        unsigned(self.require(field)?, &self.context, field)
    }

    pub(crate) fn uint_array(&self, field: &'static str) -> Result<Vec<u64>> {
        let Value::Array(items) = self.require(field)? else {
            return Err(self.wrong(field, "an array of unsigned integers"));
        };
        items.iter().map(|v| unsigned(v, &self.context, field)).collect()
    }

    pub(crate) fn wrong(&self, field: &str, expected: &'static str) -> FormatError {
        FormatError::WrongShape { context: format!("{}.{field}", self.context), expected }
    }
}

/// Reads an unsigned integer, refusing negative, float, tagged (bignum) and other values.
fn unsigned(value: &Value, context: &str, field: &'static str) -> Result<u64> {
    let found = match value {
        Value::Integer(i) => match u64::try_from(*i) {
            Ok(v) => return Ok(v),
            Err(_) if i128::from(*i) < 0 => "a negative integer",
            Err(_) => "an integer beyond 64 bits",
        },
        Value::Float(_) => "a float",
        Value::Tag(..) => "a tagged value",
        Value::Text(_) => "a text string",
        Value::Bytes(_) => "a byte string",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
        Value::Array(_) => "an array",
        Value::Map(_) => "a map",
        _ => "an unknown value",
    };
    Err(FormatError::NotUnsigned { context: context.to_owned(), field, found })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn indefinite_maps_and_strings_decode() {
        // {_ "a": (_ "x" "y")}
        let bytes = [0xbf, 0x61, b'a', 0x7f, 0x61, b'x', 0x61, b'y', 0xff, 0xff];
        let v = decode(&bytes, &limits(), Rules::ANY).unwrap();
        assert_eq!(v, Value::Map(vec![(Value::Text("a".into()), Value::Text("xy".into()))]));
    }

    #[test]
    fn declared_byte_length_beyond_input_is_refused_before_allocation() {
        // bytes(2^62) with nothing after
        let bytes = [0x5b, 0x40, 0, 0, 0, 0, 0, 0, 0];
        assert!(matches!(decode(&bytes, &limits(), Rules::ANY), Err(FormatError::CborLengthBeyondInput { .. })));
    }

    #[test]
    fn declared_array_length_beyond_input_is_refused() {
        let bytes = [0x9a, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert!(matches!(decode(&bytes, &limits(), Rules::ANY), Err(FormatError::CborLengthBeyondInput { .. })));
    }

    #[test]
    fn trailing_bytes_after_the_item_are_refused() {
        assert_eq!(decode(&[0x80, 0x00], &limits(), Rules::ANY), Err(FormatError::CborTrailingBytes { count: 1 }));
    }

    #[test]
    fn bignum_tags_stay_tagged() {
        assert_eq!(
            decode(&[0xc2, 0x41, 0x40], &limits(), Rules::ANY).unwrap(),
            Value::Tag(2, Box::new(Value::Bytes(vec![0x40])))
        );
    }

    #[test]
    fn odd_indefinite_maps_and_bad_utf8_are_refused() {
        assert!(matches!(decode(&[0xbf, 0x01, 0xff], &limits(), Rules::ANY), Err(FormatError::CborInvalid { .. })));
        assert!(matches!(decode(&[0x62, 0xff, 0xfe], &limits(), Rules::ANY), Err(FormatError::CborInvalid { .. })));
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let mut bytes = vec![0x81; 100];
        bytes.push(0x00);
        assert!(matches!(decode(&bytes, &limits(), Rules::ANY), Err(FormatError::CborTooDeep { .. })));
        let mut deep_tags = vec![0xc6; 100];
        deep_tags.push(0x00);
        assert!(matches!(decode(&deep_tags, &limits(), Rules::ANY), Err(FormatError::CborTooDeep { .. })));
    }

    #[test]
    fn item_count_above_the_limit_is_refused() {
        let mut bytes = vec![0x98, 200];
        bytes.extend(std::iter::repeat_n(0u8, 200));
        let small = Limits { max_cbor_items: 100, ..Limits::default() };
        assert!(matches!(decode(&bytes, &small, Rules::ANY), Err(FormatError::CborTooManyItems { .. })));
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        // {"a": {"k": 1, "k": 2}}
        let bytes = [0xa1, 0x61, b'a', 0xa2, 0x61, b'k', 0x01, 0x61, b'k', 0x02];
        assert!(matches!(decode(&bytes, &limits(), Rules::ANY), Err(FormatError::DuplicateKey { .. })));
    }

    #[test]
    fn invalid_headers_are_refused() {
        assert!(matches!(decode(&[0x1c], &limits(), Rules::ANY), Err(FormatError::CborInvalid { .. })));
        assert!(matches!(decode(&[0xff], &limits(), Rules::ANY), Err(FormatError::CborInvalid { .. })));
        assert!(matches!(decode(&[0x82, 0x01], &limits(), Rules::ANY), Err(FormatError::CborLengthBeyondInput { .. })));
        assert!(matches!(decode(&[0x9f, 0x01], &limits(), Rules::ANY), Err(FormatError::CborInvalid { .. })));
        assert!(matches!(decode(&[], &limits(), Rules::ANY), Err(FormatError::CborInvalid { .. })));
    }

    #[test]
    fn unsigned_fields_refuse_negative_float_and_tagged_values() {
        let map = Value::Map(vec![
            (Value::Text("neg".into()), Value::Integer((-1).into())),
            (Value::Text("flt".into()), Value::Float(1.0)),
            (Value::Text("tag".into()), Value::Tag(2, Box::new(Value::Bytes(vec![1])))),
            (Value::Text("ok".into()), Value::Integer(7.into())),
        ]);
        let fields = Fields::of(&map, "x").unwrap();
        assert_eq!(fields.required_uint("ok").unwrap(), 7);
        for (field, found) in [("neg", "a negative integer"), ("flt", "a float"), ("tag", "a tagged value")] {
            match fields.required_uint(field) {
                Err(FormatError::NotUnsigned { found: f, .. }) => assert_eq!(f, found),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    #[test]
    fn deterministic_rules_refuse_every_non_canonical_head() {
        let strict = |bytes: &[u8]| decode(bytes, &limits(), Rules::DETERMINISTIC);
        assert!(strict(&[0xa2, 0x61, 0x61, 0x01, 0x61, 0x62, 0x02]).is_ok());
        let refused = [
            &[0x18, 0x05][..],                           // 5 in two bytes
            &[0x9f, 0x01, 0xff],                         // indefinite array
            &[0xa2, 0x61, 0x62, 0x01, 0x61, 0x61, 0x02], // keys out of order
            &[0xa2, 0x61, 0x61, 0x01, 0x61, 0x61, 0x02], // duplicate keys
            &[0xfa, 0x3f, 0x80, 0x00, 0x00],             // 1.0 as f32 (fits f16)
            &[0xfb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0],       // 1.0 as f64
            &[0xf9, 0x7e, 0x01],                         // a NaN payload
            &[0xc1, 0x01],                               // a tag
        ];
        for bytes in refused {
            let error = strict(bytes).unwrap_err();
            assert_eq!(error.code(), "cbor_not_deterministic", "{bytes:02x?}: {error}");
            assert!(decode(bytes, &limits(), Rules::ANY).is_ok() || bytes[0] == 0xa2, "{bytes:02x?}");
        }
        assert!(strict(&[0xf9, 0x7e, 0x00]).is_ok());
        assert!(strict(&[0xfa, 0x3f, 0x80, 0x00, 0x01]).is_ok());
    }
}
