//! Inputs and timings for `bench/format`:
//!   bench_format manifest N          time parse + validate of a 1.2 manifest of N objects
//!   bench_format objects PATH N      write a file of N small objects (a large model's manifest)
//!   bench_format raw PATH BYTES      write a file with one raw u8 component named "blob"
//!   bench_format zstd PATH BYTES     write a file with one zstd component named "blob", and
//!                                    its bare frame to PATH.zst (for `zstd -d`)
//!   bench_format v2raw PATH BYTES    a v2 file (official writer) with one raw u8 object "blob"
//!   bench_format v2seekable PATH BYTES
//!                                    the same with a zt.zstd-seekable/1 part (the official
//!                                    writer's 1 MiB frames, level 3), and the same bytes as one
//!                                    zstd frame at the same level to PATH.zst (for `zstd -d`)
//!   bench_format layers PATH BYTES N a file of N raw bf16 tensors of BYTES/N bytes each, named
//!                                    and shaped like a transformer's layers
//!   bench_format matrix PATH ROWS COLS
//!                                    a file of one raw bf16 matrix "weight" of ROWS × COLS
//!   bench_format safetensors PATH BYTES
//!                                    a safetensors file with one U8 tensor "blob", as the
//!                                    library lays it out (header padded with spaces to 8)

use std::fs;
use std::time::Instant;

use ztserve::format::write::{ComponentInput, ObjectInput, WriteOptions, Writer};
use ztserve::format::{DType, Limits, Value, parse_file};

/// Bytes that compress like real weights do (about 2-3×), deterministically.
fn weights_like(len: usize) -> Vec<u8> {
    let mut state = 0x9E3779B97F4A7C15u64;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        // bf16-ish values: a narrow exponent band and a noisy mantissa.
        let v = (0x3C00 | (state & 0x03FF)) as u16;
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn one_blob(path: &str, bytes: &[u8], zstd_level: Option<i32>) {
    let mut w = Writer::new(std::io::BufWriter::new(fs::File::create(path).unwrap())).unwrap();
    w.add(
        &ObjectInput {
            name: "blob",
            shape: &[bytes.len() as u64],
            format: "dense",
            attributes: None,
            components: vec![ComponentInput { role: "data", dtype: DType::U8, logical_type: None, bytes }],
        },
        &WriteOptions { zstd_level, digest: None },
    )
    .unwrap();
    w.finish(None).unwrap();
}

/// A v2 file by the official writer holding `bytes` as one u8 object "blob", raw or seekable.
fn one_v2_blob(path: &str, bytes: &[u8], seekable: bool) {
    let mut w = ztensor::Writer::options().canonical(!seekable).create(path).unwrap();
    w.object("blob", |o| {
        o.shape([bytes.len() as u64]).part("data", |mut p| {
            p = p.dtype(ztensor::DType::U8);
            if seekable {
                p = p.encoding(ztserve::format::v2::ZSTD_SEEKABLE);
            }
            p.bytes(bytes)
        })
    })
    .unwrap();
    w.finish().unwrap();
}

/// A 1.2 file of `n` raw bf16 tensors of `bytes / n` bytes each, `[rows, 4096]`, named like a
/// transformer's layers: a model that loads as several tensors (and view shards).
fn layers(path: &str, bytes: usize, n: usize) {
    let each = weights_like(bytes / n);
    let mut w = Writer::new(std::io::BufWriter::new(fs::File::create(path).unwrap())).unwrap();
    for i in 0..n {
        let name = format!("model.layers.{i}.mlp.up_proj.weight");
        let shape = [each.len() as u64 / 2 / 4096, 4096];
        let data = ComponentInput { role: "data", dtype: DType::BF16, logical_type: None, bytes: &each };
        let object =
            ObjectInput { name: &name, shape: &shape, format: "dense", attributes: None, components: vec![data] };
        w.add(&object, &WriteOptions { zstd_level: None, digest: None }).unwrap();
    }
    w.finish(None).unwrap();
}

fn matrix(path: &str, rows: u64, cols: u64) {
    let bytes = weights_like((rows * cols * 2) as usize);
    let mut w = Writer::new(std::io::BufWriter::new(fs::File::create(path).unwrap())).unwrap();
    let data = ComponentInput { role: "data", dtype: DType::BF16, logical_type: None, bytes: &bytes };
    let object =
        ObjectInput { name: "weight", shape: &[rows, cols], format: "dense", attributes: None, components: vec![data] };
    w.add(&object, &WriteOptions { zstd_level: None, digest: None }).unwrap();
    w.finish(None).unwrap();
}

/// A file of `n` small tensors named and described like a transformer's layers, each with a
/// crc32c digest: its manifest is what a large real model's looks like.
fn many_objects(n: usize) -> Vec<u8> {
    let mut w = Writer::new(Vec::new()).unwrap();
    let data = [0u8; 16];
    let attributes = Value::Map(vec![(Value::Text("layer".into()), Value::Integer(3.into()))]);
    for i in 0..n {
        let name = format!("model.layers.{}.self_attn.q_proj.weight", i);
        w.add(
            &ObjectInput {
                name: &name,
                shape: &[2, 2],
                format: "dense",
                attributes: Some(attributes.clone()),
                components: vec![ComponentInput { role: "data", dtype: DType::F32, logical_type: None, bytes: &data }],
            },
            &WriteOptions { zstd_level: None, digest: Some(ztserve::format::write::DigestAlgorithm::Crc32c) },
        )
        .unwrap();
    }
    w.finish(None).unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args[1].as_str() {
        "manifest" => {
            let n: usize = args[2].parse().unwrap();
            let file = many_objects(n);
            let mut times = Vec::new();
            for _ in 0..30 {
                let start = Instant::now();
                let m = parse_file(&file, &Limits::default()).unwrap();
                times.push(start.elapsed().as_secs_f64() * 1e3);
                assert_eq!(m.objects.len(), n);
            }
            times.sort_by(f64::total_cmp);
            let span = ztserve::format::parse_file(&file, &Limits::default()).unwrap().manifest_span;
            println!("{:.3} {:.3} {}", times[times.len() / 2], times[times.len() * 9 / 10], span.end - span.start);
        }
        "objects" => fs::write(&args[2], many_objects(args[3].parse().unwrap())).unwrap(),
        "raw" => one_blob(&args[2], &weights_like(args[3].parse().unwrap()), None),
        "layers" => layers(&args[2], args[3].parse().unwrap(), args[4].parse().unwrap()),
        "matrix" => matrix(&args[2], args[3].parse().unwrap(), args[4].parse().unwrap()),
        "zstd" => {
            let bytes = weights_like(args[3].parse().unwrap());
            one_blob(&args[2], &bytes, Some(3));
            let file = fs::read(&args[2]).unwrap();
            let m = parse_file(&file, &Limits::default()).unwrap();
            let c = &m.objects[0].components[0];
            fs::write(
                format!("{}.zst", args[2]),
                &file[c.stored_range().start as usize..c.stored_range().end as usize],
            )
            .unwrap();
        }
        "v2raw" => one_v2_blob(&args[2], &weights_like(args[3].parse().unwrap()), false),
        "v2seekable" => {
            let bytes = weights_like(args[3].parse().unwrap());
            one_v2_blob(&args[2], &bytes, true);
            // One frame, checksummed like the seekable frames, at their level.
            let mut frame = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            frame.include_checksum(true).unwrap();
            std::io::Write::write_all(&mut frame, &bytes).unwrap();
            fs::write(format!("{}.zst", args[2]), frame.finish().unwrap()).unwrap();
        }
        "safetensors" => {
            let bytes = weights_like(args[3].parse().unwrap());
            let mut header =
                format!(r#"{{"blob":{{"dtype":"U8","shape":[{0}],"data_offsets":[0,{0}]}}}}"#, bytes.len())
                    .into_bytes();
            header.resize(header.len().next_multiple_of(8), b' ');
            let mut file = fs::File::create(&args[2]).unwrap();
            std::io::Write::write_all(&mut file, &(header.len() as u64).to_le_bytes()).unwrap();
            std::io::Write::write_all(&mut file, &header).unwrap();
            std::io::Write::write_all(&mut file, &bytes).unwrap();
        }
        other => panic!("unknown mode {other}"),
    }
}
