//! `ztserve pull` against a real server (the binary, on 127.0.0.1): rebuilt and raw copies
//! byte for byte, legacy big-endian data, v2 and safetensors models, `--objects`, resume after
//! a kill, a model replaced
//! between runs, digest mismatches, tokens, and retries while the server is not up yet.
//! Interop of pulled files with the official ztensor==1.2.3 reader is in the Python client's
//! tests (clients/python/tests), which run in the same `scripts/test`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{RunningServer, cbor, legacy_file, map, model, noise, start_binary, text, uint};
use ztserve::format::{DType, Limits, Value, parse_file};

fn serve(dir: &Path, envs: &[(&str, &str)]) -> RunningServer {
    start_binary(&["serve", "--source", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"], envs)
}

fn pull_command(address: &str, model: &str, out: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ztserve"));
    command.args(["pull", "--progress", "none"]).args(extra).arg(format!("http://{address}/models/{model}")).arg(out);
    command.env_remove("ZTSERVE_TOKEN");
    command
}

fn pull(address: &str, model: &str, out: &Path, extra: &[&str]) -> Output {
    pull_command(address, model, out, extra).output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn succeeded(output: &Output) -> String {
    let text = stderr(output);
    assert!(output.status.success(), "pull failed: {text}");
    text
}

/// The `N fetched` and `N kept` figures of a pull's summary line.
fn figures(summary: &str) -> (u64, u64) {
    let number_before = |word: &str| -> u64 {
        summary.split(word).next().and_then(|s| s.split_whitespace().last()).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    (number_before(" fetched"), if summary.contains(" kept from") { number_before(" kept from") } else { 0 })
}

fn big_model(seed: u64) -> Vec<u8> {
    let a = noise(3 << 20, seed);
    let b = noise(5 << 20, seed + 1);
    let c: Vec<u8> = (0..1u32 << 18).flat_map(|i| (i / 7).to_le_bytes()).collect();
    model(&[("a", DType::U8, &a, false), ("b.weight", DType::F32, &b, false), ("c", DType::U32, &c, true)])
}

fn partials(out: &Path) -> (PathBuf, PathBuf) {
    ztserve::pull::journal::partial_paths(out)
}

#[test]
fn a_pull_rebuilds_the_served_file_byte_for_byte_and_raw_copies_it() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(models.join("demo")).unwrap();
    let big = big_model(1);
    std::fs::write(models.join("big.zt"), &big).unwrap();
    for name in ["dense.zt", "structured.zt"] {
        std::fs::copy(Path::new("models/demo").join(name), models.join("demo").join(name)).unwrap();
    }
    let server = serve(&models, &[]);
    let out = dir.path().join("out.zt");
    // Our writer made these files, so a rebuild lays them out exactly as they are.
    for (id, original) in [
        ("big", big.clone()),
        ("demo%2Fstructured", std::fs::read("models/demo/structured.zt").unwrap()),
        ("demo/dense", std::fs::read("models/demo/dense.zt").unwrap()),
    ] {
        for extra in [&[][..], &["--raw"][..], &["--concurrency", "3", "--chunk-size", "100000"][..]] {
            let summary = succeeded(&pull(&server.address, id, &out, extra));
            assert!(
                std::fs::read(&out).unwrap() == original,
                "{id} {extra:?}: the pulled file differs from the served one"
            );
            assert!(
                !partials(&out).0.exists() && !partials(&out).1.exists(),
                "the partial file and journal are removed"
            );
            assert!(summary.contains("digests verified"), "{summary}");
        }
    }
    let summary = succeeded(&pull(&server.address, "big", &out, &[]));
    assert!(summary.contains("3 digests verified"), "{summary}");
}

#[test]
fn objects_select_a_subset_and_a_pattern_matching_nothing_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy("models/demo/dense.zt", dir.path().join("dense.zt")).unwrap();
    let server = serve(dir.path(), &[]);
    let out = dir.path().join("subset.zt");
    succeeded(&pull(&server.address, "dense", &out, &["--objects", "*.weight", "--objects", "scale"]));
    let file = std::fs::read(&out).unwrap();
    let manifest = parse_file(&file, &Limits::default()).unwrap();
    let names: Vec<_> = manifest.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["embed.weight", "scale", "head.weight", "fp8.weight"]);
    assert!(ztserve::format::verify::verify_file(&file, &Limits::default()).is_valid());
    assert!(manifest.attributes.is_some(), "file attributes are kept");

    let failed = pull(&server.address, "dense", &dir.path().join("none.zt"), &["--objects", "nothing*"]);
    assert!(!failed.status.success() && stderr(&failed).contains("no object matches"), "{}", stderr(&failed));
    assert!(!dir.path().join("none.zt").exists());
}

#[test]
fn legacy_big_endian_data_is_rebuilt_little_endian() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = vec![0u8; 56];
    data.extend_from_slice(&[0x00, 0x00, 0x01, 0x02, 0xAA, 0xBB, 0xCC, 0xDD]);
    let entry = |name: &str, endianness: &str| {
        map(vec![
            ("name", text(name)),
            ("offset", uint(64)),
            ("size", uint(8)),
            ("dtype", text("int32")),
            ("shape", Value::Array(vec![uint(2)])),
            ("encoding", text("raw")),
            ("data_endianness", text(endianness)),
        ])
    };
    let index = Value::Array(vec![entry("be", "big"), entry("le", "little")]);
    std::fs::write(dir.path().join("old.zt"), legacy_file(&data, &cbor(&index))).unwrap();
    let server = serve(dir.path(), &[]);
    let out = dir.path().join("new.zt");
    succeeded(&pull(&server.address, "old", &out, &[]));
    let file = std::fs::read(&out).unwrap();
    let manifest = parse_file(&file, &Limits::default()).unwrap();
    assert_eq!(manifest.version.as_deref(), Some("1.2.0"));
    let bytes = |name: &str| {
        let c = manifest.object(name).unwrap().component("data").unwrap();
        file[c.offset as usize..(c.offset + c.stored_length) as usize].to_vec()
    };
    assert_eq!(bytes("be"), [0x02, 0x01, 0x00, 0x00, 0xDD, 0xCC, 0xBB, 0xAA]);
    assert_eq!(bytes("le"), [0x00, 0x00, 0x01, 0x02, 0xAA, 0xBB, 0xCC, 0xDD]);
}

/// Starts a slow pull (one connection, 16 KiB GETs) and sends it `signal` (`INT`, as Ctrl-C
/// does, or `KILL`) once its journal records `lines` ranges.
fn kill_mid_pull(address: &str, model: &str, out: &Path, lines: usize, signal: &str) {
    let mut child = pull_command(address, model, out, &["--concurrency", "1", "--chunk-size", "16K"]).spawn().unwrap();
    let journal = partials(out).1;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let recorded = std::fs::read_to_string(&journal)
            .map(|t| t.lines().filter(|l| !l.starts_with("sync ")).count())
            .unwrap_or(0);
        if recorded > lines {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the pull ended before it could be interrupted");
        assert!(Instant::now() < deadline, "the pull made no progress");
        std::thread::sleep(Duration::from_millis(2));
    }
    let sent =
        std::process::Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    if signal == "INT" {
        assert_eq!(status.code(), Some(130), "Ctrl-C exits 130");
    }
    assert!(!out.exists(), "an interrupted pull leaves no output");
}

#[test]
fn a_second_run_after_a_kill_fetches_only_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let big = big_model(2);
    std::fs::write(dir.path().join("big.zt"), &big).unwrap();
    let server = serve(dir.path(), &[]);
    let out = dir.path().join("big.zt.out");
    let blobs: u64 = {
        let m = parse_file(&big, &Limits::default()).unwrap();
        m.objects.iter().flat_map(|o| &o.components).map(|c| c.stored_length).sum()
    };
    // Ctrl-C syncs what was written and keeps all of it.
    kill_mid_pull(&server.address, "big", &out, 40, "INT");
    let summary = succeeded(&pull(&server.address, "big", &out, &[]));
    let (fetched, kept) = figures(&summary);
    assert!(kept >= 40 * 16 * 1024, "at least the journaled ranges are kept: {summary}");
    assert_eq!(fetched + kept, blobs, "every blob byte is fetched once across the two runs: {summary}");
    assert!(std::fs::read(&out).unwrap() == big);

    // SIGKILL syncs nothing: what the last background sync vouched for is kept, the rest
    // fetched again, and the output is still exact.
    std::fs::remove_file(&out).unwrap();
    kill_mid_pull(&server.address, "big", &out, 40, "KILL");
    let summary = succeeded(&pull(&server.address, "big", &out, &[]));
    let (fetched, kept) = figures(&summary);
    assert_eq!(fetched + kept, blobs, "{summary}");
    assert!(std::fs::read(&out).unwrap() == big);
}

#[test]
fn a_model_replaced_between_runs_is_pulled_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.zt");
    std::fs::write(&path, big_model(3)).unwrap();
    let server = serve(dir.path(), &[("ZTSERVE_SOURCES__RESCAN_INTERVAL_SECS", "1")]);
    let out = dir.path().join("big.zt.out");
    kill_mid_pull(&server.address, "big", &out, 10, "INT");
    let etag = || {
        common::request(&server.address, "/models/big/file", &[("Range", "bytes=0-0")])
            .header("etag")
            .map(str::to_owned)
    };
    let before = etag();
    let replacement = big_model(4);
    let staged = dir.path().join("big.zt.new");
    std::fs::write(&staged, &replacement).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while etag() == before {
        assert!(Instant::now() < deadline, "the server never picked up the replacement");
        std::thread::sleep(Duration::from_millis(100));
    }
    let summary = succeeded(&pull(&server.address, "big", &out, &[]));
    assert!(!summary.contains("kept from"), "nothing of the old version is kept: {summary}");
    assert!(std::fs::read(&out).unwrap() == replacement);
}

#[test]
fn bytes_that_miss_their_digest_fail_the_pull_and_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let mut file = big_model(5);
    let manifest = parse_file(&file, &Limits::default()).unwrap();
    let blob = manifest.object("b.weight").unwrap().component("data").unwrap().offset as usize;
    file[blob + 1000] ^= 0x40;
    std::fs::write(dir.path().join("bad.zt"), &file).unwrap();
    // The server is told not to check, so only the pull can notice.
    let server = serve(dir.path(), &[("ZTSERVE_SERVING__VERIFY", "never")]);
    for extra in [&[][..], &["--raw"][..]] {
        let out = dir.path().join("bad.out");
        let failed = pull(&server.address, "bad", &out, extra);
        let text = stderr(&failed);
        assert_eq!(failed.status.code(), Some(1), "{text}");
        assert!(text.contains("do not match their declared digest") && text.contains("b.weight"), "{text}");
        assert!(!out.exists(), "{extra:?}: no output from a failed pull");
    }
}

#[test]
fn the_bearer_token_comes_from_ztserve_token() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy("models/demo/dense.zt", dir.path().join("dense.zt")).unwrap();
    let token = "pull-test-token-0123456789";
    let server = serve(dir.path(), &[("ZTSERVE_AUTH__TOKENS", token)]);
    let out = dir.path().join("out.zt");
    let refused = pull(&server.address, "dense", &out, &[]);
    assert!(
        !refused.status.success() && stderr(&refused).contains("401") && stderr(&refused).contains("ZTSERVE_TOKEN"),
        "{}",
        stderr(&refused)
    );
    let allowed = pull_command(&server.address, "dense", &out, &[]).env("ZTSERVE_TOKEN", token).output().unwrap();
    succeeded(&allowed);
    assert!(std::fs::read(&out).unwrap() == std::fs::read("models/demo/dense.zt").unwrap());
}

#[test]
fn a_server_that_is_not_up_yet_is_retried_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy("models/demo/dense.zt", dir.path().join("dense.zt")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let out = dir.path().join("out.zt");
    let child = pull_command(&address, "dense", &out, &["--retries", "8"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let _server = start_binary(&["serve", "--source", dir.path().to_str().unwrap(), "--listen", &address], &[]);
    let output = child.wait_with_output().unwrap();
    succeeded(&output);
    assert!(std::fs::read(&out).unwrap() == std::fs::read("models/demo/dense.zt").unwrap());

    // With no retries, the refusal is reported at once.
    let failed = pull(
        &format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()),
        "dense",
        &out,
        &["--retries", "0"],
    );
    assert!(!failed.status.success(), "{}", stderr(&failed));
}

/// A component's decoded bytes as a served model gives them, by `ztserve cat` of a local file.
fn cat(file: &Path, object: &str) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_ztserve")).arg("cat").arg(file).arg(object).output().unwrap();
    assert!(out.status.success(), "cat {object}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// v2 models (the demo's seekable one and its root with two data shards): a rebuild is one v2
/// file (shards merged, seekable parts kept, every xxh3 digest checked over decoded bytes) that
/// holds the same tensors; `--raw` copies the stored files, every file of a sharded model into a
/// directory; a seekable part whose stored stream was altered fails the pull.
#[test]
fn v2_models_are_rebuilt_as_one_file_and_raw_copied_file_by_file() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).unwrap();
    for entry in std::fs::read_dir("models/v2").unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, models.join(path.file_name().unwrap())).unwrap();
    }
    let server = serve(&models, &[]);
    for (id, objects) in [
        ("sharded", &["layers.0.weight", "layers.1.weight", "lm_head.weight"][..]),
        ("seekable", &["embed.weight", "positions", "norm.weight"][..]),
    ] {
        let out = dir.path().join(format!("{id}.zt"));
        let summary = succeeded(&pull(&server.address, id, &out, &[]));
        assert!(summary.contains("3 digests verified"), "{summary}");
        let rebuilt = parse_file(&std::fs::read(&out).unwrap(), &Limits::default()).unwrap();
        assert!(rebuilt.shards.is_empty() && rebuilt.objects.iter().all(|o| o.components[0].file == 0));
        let verify = Command::new(env!("CARGO_BIN_EXE_ztserve")).arg("verify").arg(&out).output().unwrap();
        assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
        for object in objects {
            assert_eq!(cat(&out, object), cat(&models.join(format!("{id}.zt")), object), "{id}: {object}");
        }
    }
    let seekable = parse_file(&std::fs::read(dir.path().join("seekable.zt")).unwrap(), &Limits::default()).unwrap();
    assert_eq!(seekable.object("positions").unwrap().components[0].encoding.name(), "zt.zstd-seekable/1");

    // --raw: the stored file, or a directory of every stored file.
    let out = dir.path().join("raw-seekable.zt");
    succeeded(&pull(&server.address, "seekable", &out, &["--raw"]));
    assert!(std::fs::read(&out).unwrap() == std::fs::read(models.join("seekable.zt")).unwrap());
    let out = dir.path().join("raw-sharded");
    let summary = succeeded(&pull(&server.address, "sharded", &out, &["--raw"]));
    assert!(summary.contains("3 digests verified"), "the root's blob and both shard digests: {summary}");
    for name in ["sharded.zt", "sharded-00001-of-00002.zt", "sharded-00002-of-00002.zt"] {
        assert!(std::fs::read(out.join(name)).unwrap() == std::fs::read(models.join(name)).unwrap(), "{name}");
    }
    drop(server);

    // A byte of a seekable part's stored stream altered: the frame fails its checksum or the
    // part its digest, and no output is left.
    let mut altered = std::fs::read(models.join("seekable.zt")).unwrap();
    let part = seekable_part(&altered, "positions");
    altered[(part.start + part.end) as usize / 2] ^= 0x40;
    std::fs::write(models.join("seekable.zt"), altered).unwrap();
    let server = serve(&models, &[("ZTSERVE_SERVING__VERIFY", "never")]);
    let out = dir.path().join("altered.zt");
    let failed = pull(&server.address, "seekable", &out, &[]);
    assert!(!failed.status.success() && stderr(&failed).contains("positions"), "{}", stderr(&failed));
    assert!(!out.exists());
}

/// Where `object`'s part is stored in a v2 file.
fn seekable_part(file: &[u8], object: &str) -> std::ops::Range<u64> {
    let manifest = parse_file(file, &Limits::default()).unwrap();
    manifest.object(object).unwrap().components[0].stored_range()
}

/// A sharded safetensors checkpoint: a rebuild is one v2 file holding the same tensors (their
/// dtypes and logical types kept), and `--raw` copies the index and every shard byte for byte.
#[test]
fn a_safetensors_checkpoint_is_rebuilt_as_one_v2_file_and_raw_copied_with_its_index() {
    use safetensors::Dtype;
    let dir = tempfile::tempdir().unwrap();
    let checkpoint = dir.path().join("models/org/llama");
    std::fs::create_dir_all(&checkpoint).unwrap();
    let (embed, fp8, mask) = (noise(3 << 20, 5), noise(1000, 6), vec![0u8, 1, 1, 0]);
    let first: &[common::StTensor<'_>] = &[("embed", Dtype::BF16, vec![1024, 1536], &embed)];
    let second: &[common::StTensor<'_>] =
        &[("q", Dtype::F8_E4M3, vec![10, 100], &fp8), ("mask", Dtype::BOOL, vec![4], &mask)];
    for (name, bytes) in common::safetensors_checkpoint(&[first, second]) {
        std::fs::write(checkpoint.join(name), bytes).unwrap();
    }
    let server = serve(&dir.path().join("models"), &[]);
    let out = dir.path().join("llama.zt");
    let summary = succeeded(&pull(&server.address, "org%2Fllama", &out, &["--chunk-size", "1M"]));
    assert!(summary.contains("3 without a digest"), "{summary}");
    let rebuilt = parse_file(&std::fs::read(&out).unwrap(), &Limits::default()).unwrap();
    assert_eq!(rebuilt.container, ztserve::format::Container::V2);
    assert_eq!(rebuilt.object("q").unwrap().components[0].logical_type.as_deref(), Some("f8_e4m3fn"));
    assert_eq!(rebuilt.object("mask").unwrap().components[0].logical_type.as_deref(), Some("bool"));
    assert!(cat(&out, "embed") == embed && cat(&out, "q") == fp8 && cat(&out, "mask") == mask);

    let raw = dir.path().join("raw-llama");
    succeeded(&pull(&server.address, "org%2Fllama", &raw, &["--raw"]));
    let mut names: Vec<String> =
        std::fs::read_dir(&raw).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(
        names,
        ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
    );
    for name in &names {
        assert!(std::fs::read(raw.join(name)).unwrap() == std::fs::read(checkpoint.join(name)).unwrap(), "{name}");
    }
}
