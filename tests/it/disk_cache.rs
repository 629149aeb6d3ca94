//! The node's disk cache for remote sources, with a real S3-protocol server (moto): bytes come
//! from the origin once (eight clients at once fetch each block once) and then from disk, also after the store is stopped and after a
//! restart while it is down (from the listing and manifests the cache kept, a sharded checkpoint's index too); a block damaged on disk, even under the filesystem where no
//! stamp changes, is fetched again, never served, and the scrub finds it unread; the cache stays under its bound; a start removes what is not a block.

use crate::common;

use std::path::Path;

use common::{ModelSource, SmallDisk, last_line, metric, noise, prefetch, request_async, serve};
use ztserve::config::Config;
use ztserve::format::DType;

const BLOCK: u64 = 64 << 10;

fn origin_bytes() -> f64 {
    metric("ztserve_disk_cache_origin_bytes_total", &[])
}

fn blocks_in(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("blocks")).unwrap().map(|e| e.unwrap().path()).collect()
}

/// A 1 MiB raw model and a zstd one in S3, and a server reading them through a cache in `dir`
/// holding `max_bytes`.
async fn cached_server(dir: &Path, max_bytes: u64) -> (ModelSource, Config, Vec<u8>) {
    let source = ModelSource::s3();
    let weights = noise(1 << 20, 7);
    source.put("org/raw.zt", &common::model(&[("w", DType::U8, &weights, false)])).await;
    source.put("org/packed.zt", &common::model(&[("w", DType::U8, &weights, true)])).await;
    // Listed, its manifest read, its bytes never asked for.
    source.put("org/cold.zt", &common::model(&[("w", DType::U8, &weights, false)])).await;
    // A sharded checkpoint, its index read by the scan alone.
    let (first, second) = (&weights[..600_000], &weights[600_000..]);
    let shards: [&[common::StTensor<'_>]; 2] = [
        &[("w", safetensors::Dtype::U8, vec![first.len()], first)],
        &[("v", safetensors::Dtype::U8, vec![second.len()], second)],
    ];
    for (name, bytes) in common::safetensors_checkpoint(&shards) {
        source.put(&format!("org/sharded/{name}"), &bytes).await;
    }
    let mut config = source.config(Config::default());
    config.cache.dir = Some(dir.to_owned());
    config.cache.max_bytes = max_bytes;
    config.cache.block_bytes = BLOCK;
    (source, config, weights)
}

/// The whole body of `GET /models/{model}/objects/w`, once every block it read is kept on disk:
/// a block goes to its readers before it is written, so the test waits for the writes the way
/// an operator does, with a prefetch of the model, which ends when they are done.
async fn get(address: &str, path: &str) -> Vec<u8> {
    let reply = request_async(address, path, &[]).await;
    assert_eq!(reply.status, 200, "{path}: {}", reply.head);
    assert!(reply.complete, "{path}: cut short");
    let model = path.trim_start_matches("/models/").split('/').next().unwrap();
    assert_eq!(last_line(&prefetch(address, model).await.body)["done"], true);
    reply.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_come_from_the_origin_once_then_from_disk_even_with_the_store_stopped_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, config, weights) = cached_server(dir.path(), 1 << 30).await;
    let (address, server) = serve(config.clone()).await;
    let before = origin_bytes();
    // Eight clients at once, each loading both models.
    let loads = (0..8).map(|_| async {
        for model in ["org%2Fraw", "org%2Fpacked"] {
            assert_eq!(get(&address, &format!("/models/{model}/objects/w")).await, weights);
        }
    });
    futures_util::future::join_all(loads).await;
    let sharded = |address: String| {
        let weights = weights.clone();
        async move {
            assert_eq!(get(&address, "/models/org%2Fsharded/objects/w").await, weights[..600_000]);
            assert_eq!(get(&address, "/models/org%2Fsharded/objects/v").await, weights[600_000..]);
        }
    };
    sharded(address.clone()).await;
    let fetched = origin_bytes() - before;
    let stored: u64 = blocks_in(dir.path()).iter().map(|p| std::fs::metadata(p).unwrap().len() - 8).sum();
    assert!(fetched >= (1 << 20) as f64, "{fetched} bytes from the origin");
    // Every byte this process fetched (the scan's manifests too) is in a block kept, once.
    let all_fetched = origin_bytes();
    assert_eq!(all_fetched, stored as f64, "a block fetched twice: {all_fetched} bytes from the origin, {stored} kept");
    let hits = metric("ztserve_disk_cache_hits_total", &[]);
    for model in ["org%2Fraw", "org%2Fpacked"] {
        let body = get(&address, &format!("/models/{model}/objects/w")).await;
        assert_eq!(body, weights);
        let ranged =
            request_async(&address, &format!("/models/{model}/objects/w"), &[("Range", "bytes=70000-200000")]).await;
        assert_eq!(ranged.body, weights[70000..=200000]);
    }
    assert_eq!(origin_bytes() - before, fetched, "read again from the origin");
    assert!(metric("ztserve_disk_cache_hits_total", &[]) > hits);
    let held = metric("ztserve_disk_cache_bytes", &[]);
    let on_disk: u64 = blocks_in(dir.path()).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert!(held >= fetched && held == on_disk as f64, "held {held}, on disk {on_disk}, fetched {fetched}");

    // The store stops: every cached byte still serves, and a rescan keeps the models listed.
    let ModelSource::S3 { server: store, .. } = &mut source else { unreachable!() };
    store.stop();
    server.rescan().await;
    for model in ["org%2Fraw", "org%2Fpacked"] {
        assert_eq!(get(&address, &format!("/models/{model}/objects/w")).await, weights);
    }

    // Restarted while the store is still down: the listing and manifests the cache kept list
    // the models; what is cached serves, what is not answers 503 with Retry-After.
    let (again, _restarted) = serve(config.clone()).await;
    let before = origin_bytes();
    for model in ["org%2Fraw", "org%2Fpacked"] {
        assert_eq!(get(&again, &format!("/models/{model}/objects/w")).await, weights);
    }
    sharded(again.clone()).await;
    assert_eq!(origin_bytes(), before);
    let cold = request_async(&again, "/models/org%2Fcold/objects/w", &[]).await;
    assert_eq!((cold.status, cold.header("retry-after")), (503, Some("5")), "{}", cold.head);
    assert_eq!(cold.json()["error"]["code"], "not_cached");
    assert!(cold.json()["error"]["message"].as_str().unwrap().contains("the disk cache holds"), "{}", cold.json());
    let ready = request_async(&again, "/readyz", &[]).await;
    assert_eq!(ready.status, 200, "serving from the disk cache is degraded, not unavailable");
    let ready = ready.json();
    assert_eq!(ready["status"], "degraded");
    assert_eq!(
        (ready["sources"][0]["status"].as_str(), ready["sources"][0]["serving_from"].as_str()),
        (Some("unavailable"), Some("disk_cache"))
    );
    let listed = request_async(&again, "/models", &[]).await.json();
    let entry = |id: &str| listed["models"].as_array().unwrap().iter().find(|m| m["id"] == id).unwrap().clone();
    assert_eq!(entry("org/raw")["disk_cache"]["complete"], true);
    assert_eq!(entry("org/raw")["serving_from"], "disk_cache");
    assert_eq!(entry("org/cold")["disk_cache"]["complete"], false);

    // The store back (moto restarted empty, the object written again): the blocks kept are
    // used, as moto gives the rewritten object the same ETag (the MD5 of its bytes).
    store.start();
    store.create_bucket("models");
    source.put("org/raw.zt", &common::model(&[("w", DType::U8, &weights, false)])).await;
    let (third, _restarted) = serve(config).await;
    let before = origin_bytes();
    assert_eq!(get(&third, "/models/org%2Fraw/objects/w").await, weights);
    assert_eq!(origin_bytes(), before, "blocks kept across the restart were fetched again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_damaged_on_disk_is_fetched_again_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let (_source, config, weights) = cached_server(dir.path(), 1 << 30).await;
    let (address, _server) = serve(config).await;
    assert_eq!(get(&address, "/models/org%2Fraw/objects/w").await, weights);
    for block in blocks_in(dir.path()) {
        let mut bytes = std::fs::read(&block).unwrap();
        bytes[10] ^= 0x55;
        std::fs::write(&block, bytes).unwrap();
    }
    let (damaged, fetched) = (metric("ztserve_disk_cache_damaged_blocks_total", &[]), origin_bytes());
    assert_eq!(get(&address, "/models/org%2Fraw/objects/w").await, weights);
    assert!(metric("ztserve_disk_cache_damaged_blocks_total", &[]) >= damaged + 16.0);
    assert!(origin_bytes() >= fetched + (1 << 20) as f64, "the damaged blocks were fetched again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_stays_under_its_bound_evicting_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let bound = 5 * (BLOCK + 8);
    let (_source, config, weights) = cached_server(dir.path(), bound).await;
    let (address, _server) = serve(config).await;
    let evictions = metric("ztserve_disk_cache_evictions_total", &[]);
    for _ in 0..2 {
        for model in ["org%2Fraw", "org%2Fpacked"] {
            assert_eq!(get(&address, &format!("/models/{model}/objects/w")).await, weights);
        }
        let on_disk: u64 = blocks_in(dir.path()).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
        assert!(on_disk <= bound, "{on_disk} bytes on disk, bound {bound}");
    }
    assert!(metric("ztserve_disk_cache_evictions_total", &[]) >= evictions + 16.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_removes_temporaries_and_what_is_not_a_block() {
    let dir = tempfile::tempdir().unwrap();
    let (_source, config, weights) = cached_server(dir.path(), 1 << 30).await;
    let first = common::InProcess::start(config.clone(), false).await;
    assert_eq!(get(&first.address, "/models/org%2Fraw/objects/w").await, weights);
    // A body may end before its last blocks are on disk: the server writes them after.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_dir(dir.path().join("tmp")).unwrap().count() > 0 {
        assert!(std::time::Instant::now() < deadline, "a block write never ended");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The directory is one server's: the first is gone before the second starts.
    first.stop().await.unwrap();
    let blocks = blocks_in(dir.path()).len();
    std::fs::write(dir.path().join("tmp/torn-fill.0"), b"half a block").unwrap();
    std::fs::write(dir.path().join("blocks/not-a-block"), b"stray").unwrap();
    std::fs::write(dir.path().join("blocks/00000000000000000000000000000000-0"), b"").unwrap();
    let (_again, _restarted) = serve(config).await;
    assert_eq!(std::fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    assert_eq!(blocks_in(dir.path()).len(), blocks, "only the blocks are left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_prefetched_at_start_and_on_request_and_pinned_ones_are_never_evicted() {
    let dir = tempfile::tempdir().unwrap();
    // Room for 24 blocks: the pinned model's 17 and a few more.
    let (mut source, mut config, weights) = cached_server(dir.path(), 24 * (BLOCK + 8)).await;
    config.cache.prefetch = vec!["org/raw".into()];
    config.cache.pinned = vec!["org/raw".into()];
    let (address, _server) = serve(config).await;

    // Prefetched at start: a POST joins the fetch under way and streams its progress to the end.
    let lines = prefetch(&address, "org%2Fraw").await;
    assert_eq!(lines.status, 200);
    let last = last_line(&lines.body);
    assert_eq!((last["done"].as_bool(), last["complete"].as_bool()), (Some(true), Some(true)), "{last}");
    assert_eq!(last["cached_bytes"], last["total_bytes"]);

    // Another model on request; then reading it and a third evicts, but never the pinned one.
    let packed = prefetch(&address, "org%2Fpacked").await;
    let last = last_line(&packed.body);
    assert_eq!(last["done"], true, "{last}");
    for model in ["org%2Fpacked", "org%2Fcold"] {
        assert_eq!(get(&address, &format!("/models/{model}/objects/w")).await, weights);
    }
    assert!(metric("ztserve_disk_cache_evictions_total", &[]) > 0.0);
    let raw = request_async(&address, "/models/org%2Fraw/prefetch", &[]).await.json();
    assert_eq!(raw["complete"], true, "the pinned model lost blocks: {raw}");

    // And serves with the store stopped.
    let ModelSource::S3 { server: store, .. } = &mut source else { unreachable!() };
    store.stop();
    assert_eq!(get(&address, "/models/org%2Fraw/objects/w").await, weights);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_on_a_full_disk_serves_every_byte_and_stays_under_its_bound() {
    // A disk smaller than the bound: blocks that do not fit are served, counted, not kept.
    let disk = SmallDisk::mount(512 << 10);
    let (_source, config, weights) = cached_server(disk.dir.path(), 64 << 20).await;
    let (address, _server) = serve(config).await;
    let failures = metric("ztserve_disk_cache_fill_failures_total", &[]);
    for model in ["org%2Fraw", "org%2Fpacked", "org%2Fraw"] {
        assert_eq!(get(&address, &format!("/models/{model}/objects/w")).await, weights);
    }
    assert!(metric("ztserve_disk_cache_fill_failures_total", &[]) > failures, "the disk never filled");
    assert_eq!(std::fs::read_dir(disk.dir.path().join("tmp")).unwrap().count(), 0, "a failed fill left a temporary");
    drop(_server);

    // A bound below the disk's size: eviction keeps it there, and nothing fails.
    let disk = SmallDisk::mount(2 << 20);
    let bound = 8 * (BLOCK + 8);
    let (_source, config, weights) = cached_server(disk.dir.path(), bound).await;
    let (address, _server) = serve(config).await;
    let failures = metric("ztserve_disk_cache_fill_failures_total", &[]);
    for model in ["org%2Fraw", "org%2Fpacked", "org%2Fcold", "org%2Fraw"] {
        assert_eq!(get(&address, &format!("/models/{model}/objects/w")).await, weights);
        let on_disk: u64 = blocks_in(disk.dir.path()).iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
        assert!(on_disk <= bound, "{on_disk} bytes on disk, bound {bound}");
    }
    assert_eq!(metric("ztserve_disk_cache_fill_failures_total", &[]), failures);
}

/// An ext4 filesystem in an image file, mounted through a loop device (unmounted when
/// dropped), so a test can damage a file's bytes in the image, under the filesystem, as rot
/// does: neither the file's inode nor its change time moves.
struct Ext4Disk {
    image: tempfile::NamedTempFile,
    dir: tempfile::TempDir,
}

impl Ext4Disk {
    fn mount(bytes: u64) -> Ext4Disk {
        let image = tempfile::NamedTempFile::new().unwrap();
        image.as_file().set_len(bytes).unwrap();
        let run = |program: &str, args: &[&std::ffi::OsStr]| {
            let status = std::process::Command::new(program).args(args).status().expect("e2fsprogs and mount run");
            assert!(status.success(), "{program} failed (the test suite runs as root, as scripts/test needs)");
        };
        // 4 KiB blocks, the unit `rot` reads extents in (a small filesystem defaults to 1 KiB).
        run("mkfs.ext4", &["-q".as_ref(), "-F".as_ref(), "-b".as_ref(), "4096".as_ref(), image.path().as_os_str()]);
        let dir = tempfile::tempdir().unwrap();
        run("mount", &["-o".as_ref(), "loop".as_ref(), image.path().as_os_str(), dir.path().as_os_str()]);
        Ext4Disk { image, dir }
    }

    /// Flips one byte of `file`'s first block in the image, then drops the file's pages, so
    /// the next read of it comes from the (damaged) device; whether it does (a page the
    /// server holds mapped, a manifest's, stays in memory, undamaged).
    fn rot(&self, file: &Path) -> bool {
        // Written back first: a block still in delayed allocation has no place on the device.
        std::fs::File::open(file).unwrap().sync_all().unwrap();
        let out = std::process::Command::new("filefrag").args(["-v", "-b4096"]).arg(file).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // "   0:        0..      48:        293..       341:     49:   last,eof"
        let extent = text.lines().find(|l| l.trim_start().starts_with("0:")).expect("filefrag lists the first extent");
        let physical: u64 = extent.split(':').nth(2).unwrap().split("..").next().unwrap().trim().parse().unwrap();
        assert!(physical > 0, "{text}");
        let stat = std::fs::metadata(file).unwrap();
        use std::os::unix::fs::{FileExt as _, MetadataExt as _};
        let image = std::fs::OpenOptions::new().read(true).write(true).open(self.image.path()).unwrap();
        let mut byte = [0u8];
        image.read_exact_at(&mut byte, physical * 4096 + 10).unwrap();
        image.write_all_at(&[byte[0] ^ 0x55], physical * 4096 + 10).unwrap();
        image.sync_all().unwrap();
        let opened = std::fs::File::open(file).unwrap();
        rustix::fs::fadvise(&opened, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        let after = std::fs::metadata(file).unwrap();
        assert_eq!((after.ino(), after.ctime(), after.ctime_nsec()), (stat.ino(), stat.ctime(), stat.ctime_nsec()));
        let mut now = [0u8];
        opened.read_exact_at(&mut now, 10).unwrap();
        now != byte
    }
}

impl Drop for Ext4Disk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_rotten_under_the_filesystem_is_never_served_and_the_scrub_finds_it_unread() {
    let disk = Ext4Disk::mount(64 << 20);
    let (_source, mut config, weights) = cached_server(disk.dir.path(), 1 << 30).await;
    config.cache.scrub_bytes_per_second = 1 << 30;
    let (address, _server) = serve(config).await;
    assert_eq!(get(&address, "/models/org%2Fraw/objects/w").await, weights);
    // Read: every rotten block is found, removed, fetched again; the body is exact.
    let (damaged, fetched) = (metric("ztserve_disk_cache_damaged_blocks_total", &[]), origin_bytes());
    let rotten = blocks_in(disk.dir.path()).iter().filter(|block| disk.rot(block)).count();
    assert!(rotten >= 16, "{rotten} blocks rotten");
    assert_eq!(get(&address, "/models/org%2Fraw/objects/w").await, weights);
    assert!(metric("ztserve_disk_cache_damaged_blocks_total", &[]) >= damaged + 16.0);
    assert!(origin_bytes() >= fetched + (1 << 20) as f64, "the rotten blocks were fetched again");

    // Unread: the scrub finds each one and removes it, with no request.
    // The weights' blocks only: the other models' manifest blocks are read again by rescans.
    let damaged = metric("ztserve_disk_cache_damaged_blocks_total", &[]);
    let blocks = blocks_in(disk.dir.path());
    let object_of =
        |block: &std::path::PathBuf| block.file_name().unwrap().to_str().unwrap().split('-').next().unwrap().to_owned();
    let weights_object = object_of(
        blocks.iter().max_by_key(|b| blocks.iter().filter(|o| object_of(o) == object_of(b)).count()).unwrap(),
    );
    let rotten: Vec<_> =
        blocks.into_iter().filter(|block| object_of(block) == weights_object).filter(|block| disk.rot(block)).collect();
    assert!(rotten.len() >= 16, "{} blocks rotten", rotten.len());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while metric("ztserve_disk_cache_damaged_blocks_total", &[]) < damaged + rotten.len() as f64 {
        assert!(std::time::Instant::now() < deadline, "the scrub never found the rotten blocks");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(rotten.iter().all(|b| !b.exists()), "every rotten block was removed");
    assert!(metric("ztserve_disk_cache_scrubbed_bytes_total", &[]) > 0.0);
    assert_eq!(get(&address, "/models/org%2Fraw/objects/w").await, weights);
}
