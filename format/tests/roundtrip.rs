//! Writer → reader round trips over random objects, and the writer's determinism.

use proptest::prelude::*;
use ztserve_format::decode::{decode_component, stored_bytes};
use ztserve_format::verify::verify_file;
use ztserve_format::write::{ComponentInput, DigestAlgorithm, ObjectInput, WriteOptions, Writer};
use ztserve_format::{DType, Encoding, Limits, Value, parse_file};

#[derive(Debug, Clone)]
struct ComponentSpec {
    role: String,
    dtype: DType,
    logical_type: Option<&'static str>,
    bytes: Vec<u8>,
}

#[derive(Debug, Clone)]
struct ObjectSpec {
    name: String,
    shape: Vec<u64>,
    format: String,
    attributes: Option<Value>,
    components: Vec<ComponentSpec>,
    options: WriteOptions,
}

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

fn options() -> impl Strategy<Value = WriteOptions> {
    (
        prop::option::of(-3i32..=9),
        prop::option::of(prop::sample::select(vec![DigestAlgorithm::Crc32c, DigestAlgorithm::Sha256])),
    )
        .prop_map(|(zstd_level, digest)| WriteOptions { zstd_level, digest })
}

fn bytes_for(dtype: DType, count: usize) -> impl Strategy<Value = Vec<u8>> {
    let len = count * dtype.width() as usize;
    if dtype == DType::Bool {
        prop::collection::vec(0u8..=1, len).boxed()
    } else {
        // Mix random and repetitive data so zstd sees both.
        prop_oneof![prop::collection::vec(any::<u8>(), len), Just(vec![7u8; len])].boxed()
    }
}

fn attributes() -> impl Strategy<Value = Option<Value>> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|i| Value::Integer(i.into())),
        any::<f64>().prop_filter("NaN never equals itself", |f| !f.is_nan()).prop_map(Value::Float),
        ".{0,12}".prop_map(Value::Text),
        prop::collection::vec(any::<u8>(), 0..8).prop_map(Value::Bytes),
        any::<bool>().prop_map(Value::Bool),
        Just(Value::Null),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| Value::Map(m.into_iter().map(|(k, v)| (Value::Text(k), v)).collect())),
        ]
    });
    prop::option::of(
        prop::collection::btree_map("[a-z]{1,6}", value, 0..4)
            .prop_map(|m| Value::Map(m.into_iter().map(|(k, v)| (Value::Text(k), v)).collect())),
    )
}

fn dense() -> impl Strategy<Value = ObjectSpec> {
    (prop::collection::vec(0u64..5, 0..4), dtype(), prop::option::of(Just(())), options(), attributes()).prop_flat_map(
        |(shape, dtype, complex, options, attributes)| {
            let (dtype, logical_type) = match (complex, dtype) {
                (Some(()), DType::F32) => (DType::F32, Some("complex64")),
                (Some(()), DType::F64) => (DType::F64, Some("complex128")),
                (Some(()), DType::U8) => (DType::U8, Some("f8_e4m3fn")),
                _ => (dtype, None),
            };
            let ratio = if logical_type.is_some_and(|t| t.starts_with("complex")) { 2 } else { 1 };
            let count = shape.iter().product::<u64>() as usize * ratio;
            bytes_for(dtype, count).prop_map(move |bytes| ObjectSpec {
                name: String::new(),
                shape: shape.clone(),
                format: "dense".into(),
                attributes: attributes.clone(),
                components: vec![ComponentSpec { role: "data".into(), dtype, logical_type, bytes }],
                options,
            })
        },
    )
}

fn indices(values: Vec<u64>) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn sparse_csr() -> impl Strategy<Value = ObjectSpec> {
    (1u64..6, 1u64..6, dtype(), options()).prop_flat_map(|(rows, cols, dtype, options)| {
        prop::collection::vec(prop::collection::btree_set(0..cols, 0..=cols as usize), rows as usize).prop_flat_map(
            move |row_sets| {
                let nnz: usize = row_sets.iter().map(|s| s.len()).sum();
                let mut indptr = vec![0u64];
                let mut cols_of = Vec::new();
                for set in &row_sets {
                    cols_of.extend(set.iter().copied());
                    indptr.push(cols_of.len() as u64);
                }
                bytes_for(dtype, nnz).prop_map(move |values| ObjectSpec {
                    name: String::new(),
                    shape: vec![rows, cols],
                    format: "sparse_csr".into(),
                    attributes: None,
                    components: vec![
                        ComponentSpec { role: "values".into(), dtype, logical_type: None, bytes: values },
                        ComponentSpec {
                            role: "indices".into(),
                            dtype: DType::U64,
                            logical_type: None,
                            bytes: indices(cols_of.clone()),
                        },
                        ComponentSpec {
                            role: "indptr".into(),
                            dtype: DType::U64,
                            logical_type: None,
                            bytes: indices(indptr.clone()),
                        },
                    ],
                    options,
                })
            },
        )
    })
}

fn sparse_coo() -> impl Strategy<Value = ObjectSpec> {
    (prop::collection::vec(1u64..6, 1..4), 0usize..6, dtype(), options()).prop_flat_map(
        |(shape, nnz, dtype, options)| {
            let dims: Vec<_> = shape.iter().map(|&d| prop::collection::vec(0..d, nnz)).collect();
            (dims, bytes_for(dtype, nnz)).prop_map(move |(dims, values)| ObjectSpec {
                name: String::new(),
                shape: shape.clone(),
                format: "sparse_coo".into(),
                attributes: None,
                components: vec![
                    ComponentSpec { role: "values".into(), dtype, logical_type: None, bytes: values },
                    ComponentSpec {
                        role: "coords".into(),
                        dtype: DType::U64,
                        logical_type: None,
                        bytes: indices(dims.concat()),
                    },
                ],
                options,
            })
        },
    )
}

fn grouped(format: &'static str, roles: &'static [&'static str]) -> impl Strategy<Value = ObjectSpec> {
    let component = (dtype(), 0usize..40).prop_flat_map(|(d, n)| bytes_for(d, n).prop_map(move |b| (d, b)));
    (prop::collection::vec(component, roles.len()), prop::collection::vec(1u64..64, 2), options(), attributes())
        .prop_map(move |(parts, shape, options, attributes)| ObjectSpec {
            name: String::new(),
            shape,
            format: format.into(),
            attributes,
            components: roles
                .iter()
                .zip(parts)
                .map(|(role, (dtype, bytes))| ComponentSpec { role: (*role).into(), dtype, logical_type: None, bytes })
                .collect(),
            options,
        })
}

fn object() -> impl Strategy<Value = ObjectSpec> {
    prop_oneof![
        4 => dense(),
        1 => sparse_csr(),
        1 => sparse_coo(),
        1 => grouped("quantized_group", &["packed_weight", "scales", "zeros"]),
        1 => grouped("x_vendor.custom", &["lut", "blob"]),
    ]
}

fn file() -> impl Strategy<Value = Vec<ObjectSpec>> {
    prop::collection::vec((object(), "\\PC{0,10}"), 0..6).prop_map(|objects| {
        objects
            .into_iter()
            .enumerate()
            .map(|(i, (mut o, name))| {
                o.name = format!("{i}:{name}");
                o
            })
            .collect()
    })
}

fn write(objects: &[ObjectSpec], attributes: Option<Value>) -> Vec<u8> {
    let mut writer = Writer::new(Vec::new()).unwrap();
    for o in objects {
        let input = ObjectInput {
            name: &o.name,
            shape: &o.shape,
            format: &o.format,
            attributes: o.attributes.clone(),
            components: o
                .components
                .iter()
                .map(|c| ComponentInput {
                    role: &c.role,
                    dtype: c.dtype,
                    logical_type: c.logical_type,
                    bytes: &c.bytes,
                })
                .collect(),
        };
        writer.add(&input, &o.options).unwrap();
    }
    writer.finish(attributes).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_written_file_reads_back_to_the_bytes_given(objects in file(), attrs in attributes()) {
        let bytes = write(&objects, attrs.clone());
        let manifest = parse_file(&bytes, &Limits::default()).unwrap();
        prop_assert_eq!(manifest.version.as_deref(), Some("1.2.0"));
        prop_assert_eq!(&manifest.attributes, &attrs);
        prop_assert_eq!(manifest.objects.len(), objects.len());
        for (spec, object) in objects.iter().zip(&manifest.objects) {
            prop_assert_eq!(&object.name, &spec.name);
            prop_assert_eq!(&object.shape, &spec.shape);
            prop_assert_eq!(&object.format, &spec.format);
            prop_assert_eq!(&object.attributes, &spec.attributes);
            for (cs, c) in spec.components.iter().zip(&object.components) {
                prop_assert_eq!(&c.role, &cs.role);
                prop_assert_eq!(c.dtype, cs.dtype);
                prop_assert_eq!(c.logical_type.as_deref(), cs.logical_type);
                prop_assert_eq!(c.offset % 64, 0);
                prop_assert_eq!(c.encoding.clone(), if spec.options.zstd_level.is_some() { Encoding::Zstd } else { Encoding::Raw });
                prop_assert_eq!(c.digest.is_some(), spec.options.digest.is_some());
                let decoded = decode_component(&object.name, c, stored_bytes(&bytes, &object.name, c).unwrap()).unwrap();
                prop_assert_eq!(decoded.as_ref(), cs.bytes.as_slice());
            }
        }
        let report = verify_file(&bytes, &Limits::default());
        prop_assert!(report.is_valid(), "{:?}", report.errors);
    }

    #[test]
    fn identical_input_gives_identical_bytes(objects in file(), attrs in attributes()) {
        prop_assert_eq!(write(&objects, attrs.clone()), write(&objects, attrs));
    }

    #[test]
    fn padding_between_blobs_is_zero(objects in file()) {
        let bytes = write(&objects, None);
        let manifest = parse_file(&bytes, &Limits::default()).unwrap();
        let mut covered = vec![false; manifest.manifest_span.start as usize];
        covered[..8].fill(true);
        for object in &manifest.objects {
            for c in &object.components {
                covered[c.offset as usize..(c.offset + c.stored_length) as usize].fill(true);
            }
        }
        for (i, is_blob) in covered.iter().enumerate() {
            if !is_blob {
                prop_assert_eq!(bytes[i], 0, "padding byte {} is not zero", i);
            }
        }
    }
}
