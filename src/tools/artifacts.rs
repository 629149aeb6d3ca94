//! `ztserve artifacts publish|restore`: a directory (an engine's compile cache: vLLM's,
//! Triton's, FlashInfer's, SGLang's, TensorRT-LLM's) published to a server's artifact store as a
//! signed bundle, and restored from it on another node. Publishing uploads each file as a blob
//! under its SHA-256, then the bundle that names them, signed with the publisher's key; it
//! never writes over a bundle already published. Restoring checks the bundle's signature
//! against the keys and CA trusted, and every path, before it fetches a byte; each blob is
//! checked against its digest as it arrives, into a directory beside the target that is renamed
//! into place only when whole. A bearer token is read from ZTSERVE_TOKEN.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use futures_util::{StreamExt as _, TryStreamExt as _};
use sha2::Digest as _;
use tokio::io::AsyncWriteExt as _;

use crate::artifacts::{Bundle, BundleFile, check_path, sign_bundle, verify_bundle};
use crate::signing::{Signer, Trust};

/// Blobs moved at once.
const CONCURRENCY: usize = 8;
/// The largest signature read (as `[signing] max_signature_bytes` defaults).
const MAX_SIGNATURE_BYTES: u64 = 64 << 20;

/// The publishers a restore trusts: their public keys (PEM files) and the CAs of `ca_file`.
pub struct Publishers {
    pub public_keys: Vec<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// Where the store is, and who is asking.
pub struct Store {
    /// The server's base URL (`http://host:8080`).
    pub server: String,
    /// Bearer token (ZTSERVE_TOKEN).
    pub token: Option<String>,
}

/// How a publish ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    /// The bundle is now published, with this many files and bytes, of which these were uploaded.
    Created { files: usize, bytes: u64, uploaded: usize },
    /// A bundle of that name was there already (another node published it first).
    AlreadyThere,
}

/// How a restore ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Restored {
    /// The bundle's files are in place, signed by `signer` (none when taken unsigned).
    Whole { files: usize, bytes: u64, signer: Option<String> },
    /// Nothing is published under that name.
    NotPublished,
}

impl Store {
    fn url(&self, path: &str) -> String {
        format!("{}/artifacts/{path}", self.server.trim_end_matches('/'))
    }

    fn request(&self, client: &reqwest::Client, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = client.request(method, self.url(path));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }
}

/// The HTTP client: a stalled transfer fails rather than hangs.
fn http_client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .user_agent(concat!("ztserve-artifacts/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(10))
        .read_timeout(std::time::Duration::from_secs(60))
        .build()?)
}

/// Why a server refused: its error's code and message, or the status and body.
async fn refusal(response: reqwest::Response) -> (String, String) {
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let error = serde_json::from_str::<serde_json::Value>(&body).ok().map(|v| v["error"].clone());
    match error.as_ref().and_then(|e| Some((e["code"].as_str()?, e["message"].as_str()?))) {
        Some((code, message)) => (code.to_owned(), format!("{status}: {message}")),
        None => (String::new(), format!("{status}: {body}")),
    }
}

/// Every regular file below `dir`, relative to it, hidden ones too; a link or a special file
/// is refused (a bundle holds files only).
fn files_below(root: &Path, dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            files_below(root, &entry.path(), files)?;
        } else if kind.is_file() {
            files.push(entry.path().strip_prefix(root).expect("below the root").to_owned());
        } else {
            bail!("{} is not a regular file or a directory: a bundle holds files only", entry.path().display());
        }
    }
    Ok(())
}

/// Publishes `dir` as bundle `name`, signed with the private key of PEM file `signing_key`
/// when given.
pub async fn publish(store: &Store, name: &str, dir: &Path, signing_key: Option<&Path>) -> anyhow::Result<Published> {
    crate::artifacts::check_name(name)?;
    let signer = signing_key.map(Signer::load).transpose()?;
    let client = http_client()?;
    let existing = store.request(&client, reqwest::Method::GET, &format!("bundles/{name}")).send().await?;
    if existing.status().is_success() {
        return Ok(Published::AlreadyThere);
    }
    let mut paths = Vec::new();
    files_below(dir, dir, &mut paths)?;
    paths.sort();
    let hashed = tokio::task::block_in_place(|| super::digest::sha256_files(dir, &paths));
    let mut files = Vec::with_capacity(paths.len());
    for (path, hashed) in paths.iter().zip(hashed) {
        let (digest, size) = hashed?;
        let path = path.to_str().with_context(|| format!("{} is not a UTF-8 path", path.display()))?.to_owned();
        files.push(BundleFile { path, sha256: hex::encode(digest), size });
    }
    let uploads = futures_util::stream::iter(files.iter().map(|file| upload(store, &client, dir, file)));
    let uploaded: Vec<bool> = uploads.buffer_unordered(CONCURRENCY).try_collect().await?;
    let (count, bytes) = (files.len(), files.iter().map(|f| f.size).sum());
    // Signed for its name: a copy of the bundle under another name does not verify.
    let bundle = match &signer {
        Some(signer) => sign_bundle(signer, name, files),
        None => Bundle { files, signature: None },
    };
    let body = serde_json::to_vec(&bundle)?;
    let response = store
        .request(&client, reqwest::Method::PUT, &format!("bundles/{name}"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await?;
    match response.status() {
        reqwest::StatusCode::CREATED => {
            Ok(Published::Created { files: count, bytes, uploaded: uploaded.iter().filter(|u| **u).count() })
        }
        _ => match refusal(response).await {
            (code, _) if code == "bundle_exists" => Ok(Published::AlreadyThere),
            (_, why) => bail!("publishing {name}: {why}"),
        },
    }
}

/// Uploads one file's blob unless the store holds it; whether it was sent.
async fn upload(store: &Store, client: &reqwest::Client, dir: &Path, file: &BundleFile) -> anyhow::Result<bool> {
    let blob = format!("blobs/sha256:{}", file.sha256);
    let held = store.request(client, reqwest::Method::HEAD, &blob).send().await?;
    if held.status().is_success() {
        return Ok(false);
    }
    let path = dir.join(&file.path);
    let opened = tokio::fs::File::open(&path).await.with_context(|| format!("cannot open {}", path.display()))?;
    let body = reqwest::Body::from(opened);
    let response = store.request(client, reqwest::Method::PUT, &blob).body(body).send().await?;
    if !response.status().is_success() {
        bail!("uploading {}: {}", file.path, refusal(response).await.1);
    }
    Ok(true)
}

/// Restores bundle `name` into `dir` (absent, or an empty directory): its signature checked
/// against `publishers` first, or none when `publishers` is `None` (taken unsigned, on the
/// caller's say).
pub async fn restore(
    store: &Store,
    name: &str,
    dir: &Path,
    publishers: Option<&Publishers>,
) -> anyhow::Result<Restored> {
    crate::artifacts::check_name(name)?;
    let trust = publishers.map(|p| Trust::load(&p.public_keys, p.ca_file.as_deref())).transpose()?;
    if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!("{} is not empty: a bundle is restored into a new directory", dir.display());
    }
    let client = http_client()?;
    let response = store.request(&client, reqwest::Method::GET, &format!("bundles/{name}")).send().await?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(Restored::NotPublished);
    }
    if !response.status().is_success() {
        bail!("reading bundle {name}: {}", refusal(response).await.1);
    }
    let body = response.bytes().await.with_context(|| format!("reading bundle {name}"))?;
    let bundle: Bundle = serde_json::from_slice(&body).with_context(|| format!("bundle {name} is not a bundle"))?;
    for file in &bundle.files {
        check_path(&file.path).map_err(|why| anyhow::anyhow!("bundle {name}: path {:?} {why}", file.path))?;
    }
    let signer = match &trust {
        Some(trust) => Some(verify_bundle(trust, name, &bundle, MAX_SIGNATURE_BYTES)?),
        None => None,
    };
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".restoring-")
        .tempdir_in(parent)
        .with_context(|| format!("cannot write in {}", parent.display()))?;
    let fetches = bundle.files.iter().map(|file| fetch(store, &client, staging.path(), file));
    futures_util::stream::iter(fetches).buffer_unordered(CONCURRENCY).try_collect::<Vec<()>>().await?;
    // An empty directory named `dir` gives way; a non-empty one makes the rename fail.
    let _ = std::fs::remove_dir(dir);
    let staged = staging.keep();
    std::fs::rename(&staged, dir).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staged);
        anyhow::anyhow!("cannot move the restored bundle into {}: {e}", dir.display())
    })?;
    let bytes = bundle.files.iter().map(|f| f.size).sum();
    Ok(Restored::Whole { files: bundle.files.len(), bytes, signer })
}

/// Fetches one blob to its path below `staging`, checked against its size and digest.
async fn fetch(store: &Store, client: &reqwest::Client, staging: &Path, file: &BundleFile) -> anyhow::Result<()> {
    let response = store.request(client, reqwest::Method::GET, &format!("blobs/sha256:{}", file.sha256)).send().await?;
    if !response.status().is_success() {
        bail!("fetching {}: {}", file.path, refusal(response).await.1);
    }
    let path = staging.join(&file.path);
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    let mut out = tokio::fs::File::create(&path).await.with_context(|| format!("cannot write {}", path.display()))?;
    let (mut hasher, mut len) = (sha2::Sha256::new(), 0u64);
    let mut body = response.bytes_stream();
    while let Some(piece) = body.next().await {
        let piece = piece.with_context(|| format!("fetching {}", file.path))?;
        len += piece.len() as u64;
        if len > file.size {
            bail!("{}: the store sent more than its {} bytes", file.path, file.size);
        }
        hasher.update(&piece);
        out.write_all(&piece).await?;
    }
    let actual = hex::encode(hasher.finalize());
    if len != file.size || actual != file.sha256 {
        bail!(
            "{}: the store sent {len} bytes hashing to {actual}, not the {} of {}",
            file.path,
            file.size,
            file.sha256
        );
    }
    out.sync_all().await?;
    Ok(())
}
