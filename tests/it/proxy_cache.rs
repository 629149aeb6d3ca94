//! A standard HTTP cache in front of ztserve: nginx with `proxy_cache` (installed by
//! scripts/test) serves 16 clients loading one model by its version-pinned URLs (the manifest
//! and every tensor, raw and zstd). nginx takes the year-long `immutable` answers as they are,
//! with nothing configured but the cache itself; the origin sends each byte once (its own
//! response-byte metric), and every client gets exact bytes. The cache lock's timeout is set
//! far beyond any load, so clients that wait for a tensor being fetched never go to the origin
//! on their own, however slow the machine.

use crate::common;

use common::nginx::start_nginx;
use common::{request, request_async, serve};
use ztserve::config::{Config, SourceSpec};
use ztserve::format::DType;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_clients_through_nginx_make_the_origin_send_each_byte_once() {
    let dir = tempfile::tempdir().unwrap();
    let models = dir.path().join("models");
    std::fs::create_dir_all(models.join("org")).unwrap();
    let raw = common::noise(3 << 20, 3);
    let compressible: Vec<u8> = (0..2u32 << 20).map(|i| (i / 1000) as u8).collect();
    let small: Vec<u8> = (0..4096u32).flat_map(|i| i.to_le_bytes()).collect();
    let model = common::model(&[
        ("raw", DType::U8, &raw, false),
        ("zstd", DType::U8, &compressible, true),
        ("small", DType::U32, &small, true),
    ]);
    std::fs::write(models.join("org/llama.zt"), model).unwrap();
    let config = Config::serving(vec![SourceSpec::try_from(models.display().to_string()).unwrap()]);
    let (origin, _state) = serve(config).await;

    // The model's version, learnt once from the origin; the clients load its pinned URLs.
    let manifest = request_async(&origin, "/models/org/llama", &[]).await.json();
    let pinned = manifest["pinned_url"].as_str().unwrap().to_owned();
    let names: Vec<String> =
        manifest["objects"].as_array().unwrap().iter().map(|o| o["name"].as_str().unwrap().to_owned()).collect();
    let mut expected = vec![(pinned.clone(), request_async(&origin, &pinned, &[]).await.body)];
    for name in &names {
        let url = format!("{pinned}/objects/{name}");
        expected.push((url.clone(), request_async(&origin, &url, &[]).await.body));
    }
    assert_eq!(expected[1].1, raw, "the origin's own bytes");

    let (nginx, proxy) = {
        let (work, origin) = (dir.path().join("nginx"), origin.clone());
        tokio::task::spawn_blocking(move || start_nginx(&work, &origin)).await.unwrap()
    };
    let sent_before = common::metric("ztserve_http_response_body_bytes_total", &[]);
    let clients: Vec<_> = (0..16)
        .map(|client| {
            let (proxy, expected) = (proxy.clone(), expected.clone());
            std::thread::spawn(move || {
                // Each client takes the files in its own order, so they meet on every one.
                let mut order: Vec<usize> = (0..expected.len()).collect();
                order.rotate_left(client % expected.len());
                for i in order {
                    let (url, bytes) = &expected[i];
                    let reply = request(&proxy, url, &[]);
                    assert_eq!(reply.status, 200, "client {client}: {url}");
                    assert!(reply.body == *bytes, "client {client}: {url}: bytes differ through the cache");
                    assert_eq!(reply.header("cache-control"), Some("public, max-age=31536000, immutable"));
                }
            })
        })
        .collect();
    for client in clients {
        tokio::task::spawn_blocking(move || client.join().unwrap()).await.unwrap();
    }
    let sent = common::metric("ztserve_http_response_body_bytes_total", &[]) - sent_before;
    let once: usize = expected.iter().map(|(_, bytes)| bytes.len()).sum();
    assert_eq!(sent as usize, once, "the origin sent {sent} bytes for 16 loads of {once}");
    drop(nginx);
}
