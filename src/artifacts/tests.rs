use super::*;

fn digest(bytes: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(bytes))
}

fn body(pieces: &[&[u8]]) -> impl Stream<Item = Result<Bytes, io::Error>> + Unpin {
    futures_util::stream::iter(pieces.iter().map(|p| Ok(Bytes::copy_from_slice(p))).collect::<Vec<_>>())
}

fn file(path: &str, bytes: &[u8]) -> BundleFile {
    BundleFile { path: path.to_owned(), sha256: digest(bytes), size: bytes.len() as u64 }
}

fn bundle(files: Vec<BundleFile>) -> Bundle {
    Bundle { files, signature: None }
}

fn entries(dir: &Path) -> usize {
    fs::read_dir(dir).unwrap().count()
}

async fn store_with(dir: &Path, max_bytes: u64, blobs: &[&[u8]]) -> Arc<ArtifactStore> {
    let store = Arc::new(ArtifactStore::open(dir, max_bytes).unwrap());
    for blob in blobs {
        store.put_blob(&digest(blob), body(&[*blob]), Priority::Background).await.unwrap();
    }
    store
}

#[tokio::test]
async fn a_blob_is_kept_only_when_its_bytes_hash_to_the_digest_it_was_sent_under() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 1 << 20, &[]).await;
    let hex = digest(b"hello world");
    assert_eq!(
        store.put_blob(&hex, body(&[b"hello ", b"world"]), Priority::Background).await.unwrap(),
        BlobPut::Created
    );
    assert_eq!(
        store.put_blob(&hex, body(&[b"hello world"]), Priority::Background).await.unwrap(),
        BlobPut::AlreadyHeld
    );
    let (path, len) = store.blob(&hex).unwrap();
    assert_eq!((fs::read(path).unwrap(), len), (b"hello world".to_vec(), 11));

    let other = digest(b"other");
    let refused = store.put_blob(&other, body(&[b"not other"]), Priority::Background).await.unwrap_err();
    assert!(matches!(refused, ArtifactError::DigestMismatch { ref actual, .. } if *actual == digest(b"not other")));
    let cut = futures_util::stream::iter(vec![Ok(Bytes::from_static(b"oth")), Err(io::Error::other("reset"))]);
    assert!(matches!(store.put_blob(&other, cut, Priority::Background).await.unwrap_err(), ArtifactError::Cut(_)));
    assert!(matches!(
        store.put_blob("ABC", body(&[b"x"]), Priority::Background).await.unwrap_err(),
        ArtifactError::BadDigest(_)
    ));
    assert!(store.blob(&other).is_none());
    assert_eq!(entries(&dir.path().join("blobs/sha256")), 1, "nothing of a refused upload is kept");
    assert_eq!(entries(&dir.path().join("tmp")), 0, "no temporary is left");
    assert_eq!(store.held_bytes(), 11);
}

#[tokio::test]
async fn a_blob_over_the_bound_is_refused_as_it_streams() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 10, &[]).await;
    let big = [7u8; 11];
    let refused = store.put_blob(&digest(&big), body(&[&big[..6], &big[6..]]), Priority::Background).await.unwrap_err();
    assert!(matches!(refused, ArtifactError::TooLarge { max: 10 }), "{refused}");
    assert_eq!(entries(&dir.path().join("tmp")), 0);
}

#[tokio::test]
async fn a_bundle_is_published_once_and_only_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 1 << 20, &[b"graph", b"kernel"]).await;
    let files = vec![file("rank_0_0/backbone/graph.py", b"graph"), file("inductor/kernel.so", b"kernel")];
    let missing = bundle(vec![file("a", b"graph"), file("b", b"never uploaded")]);
    let refused = store.put_bundle("vllm/abc", &missing).unwrap_err();
    assert!(
        matches!(refused, ArtifactError::MissingBlob { ref digest, .. } if *digest == self::digest(b"never uploaded"))
    );
    let wrong_size = bundle(vec![BundleFile { size: 4, ..file("a", b"graph") }]);
    assert!(matches!(store.put_bundle("vllm/abc", &wrong_size).unwrap_err(), ArtifactError::MissingBlob { .. }));
    assert!(store.bundle_names(|_| true).is_empty(), "a refused bundle is not there at all");

    store.put_bundle("vllm/abc", &bundle(files.clone())).unwrap();
    assert_eq!(store.bundle("vllm/abc").unwrap(), bundle(files.clone()));
    let again = bundle(vec![file("other", b"graph")]);
    assert!(matches!(store.put_bundle("vllm/abc", &again).unwrap_err(), ArtifactError::Exists(_)));
    assert_eq!(store.bundle("vllm/abc").unwrap(), bundle(files), "the first publish stands");
    assert!(matches!(store.bundle("vllm/none").unwrap_err(), ArtifactError::NoBundle(_)));
}

#[tokio::test]
async fn of_publishes_under_one_name_at_once_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 1 << 20, &[b"a", b"b"]).await;
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        let racers: Vec<_> = (0..8)
            .map(|i| {
                let store = &store;
                let contents: &[u8] = if i % 2 == 0 { b"a" } else { b"b" };
                scope.spawn(move || store.put_bundle("race", &bundle(vec![file(&format!("f{i}"), contents)])))
            })
            .collect();
        racers.into_iter().map(|racer| racer.join().unwrap()).collect()
    });
    assert_eq!(outcomes.iter().filter(|o| o.is_ok()).count(), 1);
    assert!(outcomes.iter().filter_map(|o| o.as_ref().err()).all(|e| matches!(e, ArtifactError::Exists(_))));
    assert_eq!(store.bundle("race").unwrap().files.len(), 1);
}

#[tokio::test]
async fn names_and_paths_that_could_leave_their_place_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 1 << 20, &[b"x"]).await;
    for name in ["", "../x", "a/../b", "/a", "a/", "a//b", "a b", "a\\b", "n".repeat(513).as_str()] {
        let refused = store.put_bundle(name, &bundle(vec![file("x", b"x")])).unwrap_err();
        assert!(matches!(refused, ArtifactError::BadName { .. }), "{name:?}: {refused}");
    }
    for path in ["", "../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.", "a\\..\\b", "a\0b"] {
        let refused = store.put_bundle("ok", &bundle(vec![file(path, b"x")])).unwrap_err();
        assert!(matches!(refused, ArtifactError::BadBundle { .. }), "{path:?}: {refused}");
    }
    let twice = bundle(vec![file("a", b"x"), file("a", b"x")]);
    assert!(matches!(store.put_bundle("ok", &twice).unwrap_err(), ArtifactError::BadBundle { .. }));
    assert!(matches!(store.put_bundle("ok", &bundle(vec![])).unwrap_err(), ArtifactError::BadBundle { .. }));
    assert!(store.bundle_names(|_| true).is_empty());
}

/// The bytes bundle `name`'s document takes in the store.
fn document_len(name: &str, bundle: &Bundle) -> u64 {
    serde_json::to_vec(&StoredBundle { name: name.to_owned(), bundle: bundle.clone() }).unwrap().len() as u64
}

#[tokio::test]
async fn past_the_bound_the_least_recently_read_bundle_goes_with_the_blobs_only_it_named() {
    const B: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let blob = |byte: u8| [byte; B as usize];
    let (shared, first, second, third, fourth) = (blob(1), blob(2), blob(3), blob(4), blob(5));
    let first_bundle = bundle(vec![file("s", &shared), file("f", &first)]);
    let second_bundle = bundle(vec![file("s", &shared), file("f", &second)]);
    let (d1, d2) = (document_len("first", &first_bundle), document_len("second", &second_bundle));
    // Four blobs and both documents fit; a fifth blob does not.
    let bound = 4 * B + d1 + d2 + B / 2;
    let store = store_with(dir.path(), bound, &[&shared, &first, &second]).await;
    store.put_bundle("first", &first_bundle).unwrap();
    store.put_bundle("second", &second_bundle).unwrap();
    assert_eq!(store.held_bytes(), 3 * B + d1 + d2, "bundle documents count against the bound");
    std::thread::sleep(Duration::from_millis(20));
    store.bundle("first").unwrap();
    store.put_blob(&digest(&third), body(&[&third]), Priority::Background).await.unwrap();
    assert_eq!(store.held_bytes(), 4 * B + d1 + d2);
    // `second`, read least recently, makes room, with the blob only it named.
    store.put_blob(&digest(&fourth), body(&[&fourth]), Priority::Background).await.unwrap();
    assert_eq!(store.bundle_names(|_| true), ["first"]);
    assert!(store.blob(&digest(&second)).is_none(), "the blob only the evicted bundle named went with it");
    assert!(store.blob(&digest(&shared)).is_some() && store.blob(&digest(&first)).is_some());
    assert_eq!(store.held_bytes(), 4 * B + d1);
    // Blobs just uploaded, which no bundle names yet, are kept for their bundle: past them
    // the last bundle goes, and then the store is full.
    let mut uploaded = vec![third, fourth];
    let full = loop {
        let fresh = blob(10 + uploaded.len() as u8);
        match store.put_blob(&digest(&fresh), body(&[&fresh]), Priority::Background).await {
            Ok(_) => uploaded.push(fresh),
            Err(refused) => break refused,
        }
        assert!(store.held_bytes() <= bound);
        assert!(uploaded.len() < 16, "never full");
    };
    assert!(store.bundle_names(|_| true).is_empty());
    let held = B * uploaded.len() as u64;
    assert!(matches!(full, ArtifactError::Full { held: h, max } if h == held && max == bound), "{full}");
    assert!(held + B > bound);
    assert!(uploaded.iter().all(|b| store.blob(&digest(b)).is_some()), "every blob awaiting its bundle is kept");
    assert_eq!(store.held_bytes(), held);
}

#[tokio::test]
async fn an_upload_in_progress_counts_against_the_bound_until_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 100, &[]).await;
    let (sender, pieces) = tokio::sync::mpsc::channel::<Result<Bytes, io::Error>>(1);
    let stream = Box::pin(futures_util::stream::unfold(pieces, |mut pieces| async {
        pieces.recv().await.map(|piece| (piece, pieces))
    }));
    let big = [9u8; 80];
    let upload = tokio::spawn({
        let (store, hex) = (Arc::clone(&store), digest(&big));
        async move { store.put_blob(&hex, stream, Priority::Background).await }
    });
    sender.send(Ok(Bytes::copy_from_slice(&big[..60]))).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while store.held_bytes() < 60 {
        assert!(std::time::Instant::now() < deadline, "the first piece was never counted");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let other = [1u8; 50];
    let full = store.put_blob(&digest(&other), body(&[&other]), Priority::Background).await.unwrap_err();
    assert!(matches!(full, ArtifactError::Full { held: 60, max: 100 }), "{full}");
    assert_eq!(store.held_bytes(), 60, "a refused upload gives back what it counted");
    sender.send(Ok(Bytes::copy_from_slice(&big[60..]))).await.unwrap();
    drop(sender);
    assert_eq!(upload.await.unwrap().unwrap(), BlobPut::Created);
    assert_eq!(store.held_bytes(), 80);

    // A cut upload gives back all it counted.
    let cut = futures_util::stream::iter(vec![Ok(Bytes::from_static(b"0123456789")), Err(io::Error::other("reset"))]);
    assert!(matches!(
        store.put_blob(&digest(b"x"), cut, Priority::Background).await.unwrap_err(),
        ArtifactError::Cut(_)
    ));
    assert_eq!(store.held_bytes(), 80);
    assert_eq!(entries(&dir.path().join("tmp")), 0);
}

#[tokio::test]
async fn a_store_opened_again_serves_what_was_published_and_drops_what_was_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let store = store_with(dir.path(), 1 << 20, &[b"kept"]).await;
    store.put_bundle("team/cache", &bundle(vec![file("k", b"kept")])).unwrap();
    drop(store);
    fs::write(dir.path().join("tmp/crashed-upload"), b"half").unwrap();
    fs::write(dir.path().join("bundles/garbage.json"), b"{not json").unwrap();
    let store = ArtifactStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(store.bundle("team/cache").unwrap(), bundle(vec![file("k", b"kept")]));
    assert_eq!(store.bundle_names(|name| name.starts_with("team/")), ["team/cache"]);
    assert_eq!(store.bundle_names(|name| name.starts_with("other/")), Vec::<String>::new());
    let document = document_len("team/cache", &bundle(vec![file("k", b"kept")]));
    assert_eq!(store.held_bytes(), 4 + document, "the blob and the bundle's document");
    assert_eq!(entries(&dir.path().join("tmp")), 0);
    assert_eq!(entries(&dir.path().join("bundles")), 1, "a bundle file that does not parse is removed");
}

/// A P-256 key pair written as PEM files in `dir`: (private key, public key).
fn key_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let (private, public) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}.pub")));
    fs::write(&private, key.serialize_pem()).unwrap();
    fs::write(&public, key.public_key_pem()).unwrap();
    (private, public)
}

#[test]
fn a_signed_bundle_verifies_only_for_its_key_its_name_and_exactly_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let (publisher, publisher_pub) = key_pair(dir.path(), "publisher");
    let (_, other_pub) = key_pair(dir.path(), "other");
    let signer = crate::signing::Signer::load(&publisher).unwrap();
    let files = vec![file("inductor_cache/ab/graph.py", b"graph"), file("rank_0_0/model", b"model")];
    let signed = sign_bundle(&signer, "vllm/x", files.clone());
    let trust = crate::signing::Trust::load(std::slice::from_ref(&publisher_pub), None).unwrap();
    assert_eq!(verify_bundle(&trust, "vllm/x", &signed, 1 << 20).unwrap(), "key publisher.pub");

    let code = |bundle: &Bundle, trust: &crate::signing::Trust| match verify_bundle(trust, "vllm/x", bundle, 1 << 20) {
        Err(ArtifactError::Signature { refused, .. }) => refused.code().to_owned(),
        Err(ArtifactError::Unsigned(_)) => "unsigned".to_owned(),
        other => panic!("{other:?}"),
    };
    let other = crate::signing::Trust::load(&[other_pub], None).unwrap();
    assert_eq!(code(&signed, &other), "signature_untrusted");
    // The same signed bundle asked for under another name: signed for its own.
    match verify_bundle(&trust, "vllm/y", &signed, 1 << 20) {
        Err(ArtifactError::Signature { refused, .. }) => {
            assert_eq!(refused.code(), "signature_name");
            assert!(refused.to_string().contains("signed as \"vllm/x\", not \"vllm/y\""), "{refused}");
        }
        other => panic!("{other:?}"),
    }
    let mut changed = signed.clone();
    changed.files[1] = file("rank_0_0/model", b"modeL");
    assert_eq!(code(&changed, &trust), "signature_digest_mismatch");
    let mut added = signed.clone();
    added.files.push(file("rank_0_0/extra.so", b"extra"));
    assert_eq!(code(&added, &trust), "signature_unsigned_file");
    let mut partial = signed.clone();
    partial.files.pop();
    assert_eq!(code(&partial, &trust), "signature_missing_file");
    assert_eq!(code(&Bundle { files, signature: None }, &trust), "unsigned");
}

#[tokio::test]
async fn a_damaged_blob_goes_with_the_bundles_naming_it_and_the_name_is_free_again() {
    let dir = tempfile::tempdir().unwrap();
    let (kernel, graph) = (b"kernel bytes".as_slice(), b"graph".as_slice());
    let store = store_with(dir.path(), 1 << 20, &[kernel, graph]).await;
    let both = bundle(vec![file("k", kernel), file("g", graph)]);
    store.put_bundle("vllm/a", &both).unwrap();
    store.put_bundle("vllm/b", &bundle(vec![file("g", graph)])).unwrap();
    let b_document = document_len("vllm/b", &bundle(vec![file("g", graph)]));
    // A byte rots on disk.
    fs::write(store.blob(&digest(kernel)).unwrap().0, b"kernel bytez").unwrap();
    assert!(store.checked_blob(&digest(kernel)).unwrap().is_none());
    assert!(matches!(store.bundle("vllm/a").unwrap_err(), ArtifactError::NoBundle(_)), "it cannot be restored whole");
    assert_eq!(store.bundle_names(|_| true), ["vllm/b"]);
    assert!(store.checked_blob(&digest(graph)).unwrap().is_some(), "a blob another bundle names stays");
    assert_eq!(store.held_bytes(), graph.len() as u64 + b_document);
    // Published again, whole.
    store.put_blob(&digest(kernel), body(&[kernel]), Priority::Background).await.unwrap();
    store.put_bundle("vllm/a", &both).unwrap();
    assert_eq!(store.bundle("vllm/a").unwrap(), both);
    drop(store);
    let reopened = ArtifactStore::open(dir.path(), 1 << 20).unwrap();
    assert_eq!(reopened.bundle_names(|_| true), ["vllm/a", "vllm/b"]);
}
