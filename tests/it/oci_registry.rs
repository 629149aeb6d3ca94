//! The OCI distribution API at `/v2`, read by the clients registries serve: `oras` (the Python
//! SDK) pulls every model of the loader corpus (an official 1.2.3 file with zstd, official
//! 2.1.2 files, seekable among them, the safetensors peers' checkpoints, one sharded with its
//! config and tokenizer) by `latest` and by version, from a local directory and from S3, each
//! tensor compared with what the official reader returned; KServe's storage downloader
//! (`oci://…:latest-image`) and `podman pull` with `podman image mount` (what a kubelet's image
//! volume reads) write each model's image as the same files, byte for byte; `skopeo` inspects
//! each manifest and copies each artifact and each image (its index and both platforms) into an
//! OCI layout and into the reference registry (`docker-registry`, the distribution project's),
//! whose answers for the copies are compared with ztserve's: manifest bytes, digests and
//! headers. Manifests and images keep their digests across a restart, without a file read
//! again. Access goes through the token flow; statuses and error codes over plain HTTP.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::corpus::{only_viewable, put_hub_corpus};
use common::registry::{oci, start_reference_registry};
use common::{ModelSource, Reply, request_async, run_interop_script, serve};
use serde_json::{Value, json};
use ztserve::config::{Config, TokenEntry};
use ztserve::format::DType;

/// The error code of a registry error body.
fn code(reply: &Reply) -> String {
    reply.json()["errors"][0]["code"].as_str().unwrap_or_default().to_owned()
}

/// Runs skopeo with `args`; its stdout, or a panic with its stderr.
fn skopeo(args: &[&str]) -> Vec<u8> {
    common::external("skopeo");
    let out = Command::new("skopeo").args(args).output().expect("skopeo (apt) is installed by scripts/test");
    assert!(out.status.success(), "skopeo {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// Runs oci_clients.py MODE PLAN in the oras venv; its JSON summary.
async fn oci_clients(mode: &'static str, plan: &Path) -> Value {
    let plan = plan.to_owned();
    let out =
        tokio::task::spawn_blocking(move || run_interop_script("oras", "oci_clients.py", &[Path::new(mode), &plan]))
            .await
            .unwrap();
    serde_json::from_str(out.trim().lines().last().unwrap()).unwrap()
}

/// Every file under `dir`, by its path below it.
fn files_under(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, files);
            } else {
                let name = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
                files.insert(name, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut files = BTreeMap::new();
    walk(dir, dir, &mut files);
    files
}

/// podman with an image store of its own under `root` (the `vfs` driver: an image mount is a
/// directory, so nothing is left mounted), so a test touches no store of the machine's.
struct Podman {
    root: PathBuf,
}

impl Podman {
    fn run(&self, args: &[&str]) -> String {
        let (storage, run) = (self.root.join("storage"), self.root.join("run"));
        let out = Command::new("podman")
            .args(["--root", storage.to_str().unwrap(), "--runroot", run.to_str().unwrap()])
            .args(["--storage-driver", "vfs", "--events-backend", "none"])
            .args(args)
            .output()
            .expect("podman (apt) is installed by scripts/test");
        assert!(out.status.success(), "podman {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// Pulls `reference` over plain HTTP and gives the files under its `/models/`, as an image
    /// volume of it shows them.
    fn models_of(&self, reference: &str) -> BTreeMap<String, Vec<u8>> {
        self.run(&["pull", "--quiet", "--tls-verify=false", reference]);
        let mounted = self.run(&["image", "mount", reference]);
        let files = files_under(&Path::new(mounted.trim()).join("models"));
        self.run(&["image", "unmount", reference]);
        files
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["--root", self.root.join("storage").to_str().unwrap()])
            .args(["--runroot", self.root.join("run").to_str().unwrap(), "--storage-driver", "vfs"])
            .args(["rmi", "--all", "--force"])
            .output();
    }
}

/// A policy that lets skopeo copy anything (the machine's own policy is not assumed).
fn skopeo_policy(dir: &Path) -> PathBuf {
    let path = dir.join("policy.json");
    std::fs::write(&path, r#"{"default": [{"type": "insecureAcceptAnything"}]}"#).unwrap();
    path
}

async fn registry_clients_pull_every_model(source: ModelSource) {
    let dir = tempfile::tempdir().unwrap();
    let (mut hub_repos, _) = put_hub_corpus(dir.path(), &source).await;
    let mut config = source.config(Config::default());
    config.digests.store = Some(dir.path().join("digests"));
    let (address, _server) = serve(config.clone()).await;
    let tensors = only_viewable(&address, &mut hub_repos).await;

    // Every model of the corpus is a repository named by its id, tagged latest and its version.
    let mut repos = serde_json::Map::new();
    for (_, repo) in hub_repos.as_object().unwrap() {
        let name = repo["id"].as_str().unwrap().to_owned();
        let tags = oci(&address, "GET", &format!("/v2/{name}/tags/list"), &[]).await.json();
        let tags: Vec<&str> = tags["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
        let version = tags.iter().find(|t| **t != "latest" && !t.ends_with("-image")).unwrap().to_string();
        let mut expected =
            vec!["latest".to_owned(), "latest-image".into(), format!("{version}-image"), version.clone()];
        expected.sort();
        assert_eq!(tags, expected, "{name}");
        let mut entry = repo.clone();
        entry["version"] = json!(version);
        repos.insert(name, entry);
    }
    let catalog = oci(&address, "GET", "/v2/_catalog", &[]).await.json();
    for name in repos.keys() {
        assert!(catalog["repositories"].as_array().unwrap().contains(&json!(name)), "{name} not in {catalog}");
    }

    // oras pulls each repository at both tags: every tensor as the official readers read it.
    let plan = json!({ "registry": address, "out": dir.path().join("pulled"), "repos": repos });
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
    let pulled = oci_clients("pull", &plan_path).await;
    assert_eq!((pulled["tensors"].as_u64(), pulled["pulls"].as_u64()), (Some(tensors), Some(2 * repos.len() as u64)));

    // Each model's image holds the same files under /models/, byte for byte: as KServe's
    // downloader writes them, and as podman's image store holds them for an image volume.
    let kserve = oci_clients("kserve", &plan_path).await;
    assert_eq!(kserve["tensors"].as_u64(), Some(tensors));
    let podman = Podman { root: dir.path().join("podman") };
    for name in repos.keys() {
        let pulled = files_under(&dir.path().join("pulled/latest").join(name));
        assert!(!pulled.is_empty(), "{name}");
        let written = files_under(&dir.path().join("pulled/kserve").join(name));
        assert!(written == pulled, "{name}: KServe wrote {:?}, oras {:?}", written.keys(), pulled.keys());
        let reference = format!("{address}/{name}:latest-image");
        let mounted = tokio::task::block_in_place(|| podman.models_of(&reference));
        assert!(mounted == pulled, "{name}: the image holds {:?}, oras pulled {:?}", mounted.keys(), pulled.keys());
    }
    drop(podman);

    // skopeo: the raw manifest is the served one; a copy into an OCI layout checks every digest;
    // a copy into the reference registry serves the same manifest, digests and headers.
    let policy = skopeo_policy(dir.path());
    let reference = start_reference_registry(dir.path(), "").await;
    let mut digests = Vec::new();
    let mut images = Vec::new();
    for name in repos.keys() {
        let ours = oci(&address, "GET", &format!("/v2/{name}/manifests/latest"), &[]).await;
        assert_eq!(ours.status, 200, "{name}: {}", ours.head);
        let raw = skopeo(&["inspect", "--raw", "--tls-verify=false", &format!("docker://{address}/{name}:latest")]);
        assert!(raw == ours.body, "{name}: skopeo's raw manifest is not the served one");
        let layout = dir.path().join("layout").join(name.replace('/', "_"));
        std::fs::create_dir_all(&layout).unwrap();
        let policy_arg = format!("--policy={}", policy.display());
        skopeo(&[
            &policy_arg,
            "copy",
            "--src-tls-verify=false",
            &format!("docker://{address}/{name}:latest"),
            &format!("oci:{}:latest", layout.display()),
        ]);
        skopeo(&[
            &policy_arg,
            "copy",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            &format!("docker://{address}/{name}:latest"),
            &format!("docker://{}/{name}:latest", reference.address),
        ]);
        let theirs = oci(
            &reference.address,
            "GET",
            &format!("/v2/{name}/manifests/latest"),
            &[("Accept", "application/vnd.oci.image.manifest.v1+json")],
        )
        .await;
        assert!(theirs.body == ours.body, "{name}: the reference registry serves other manifest bytes");
        for header in ["docker-content-digest", "content-type", "content-length", "docker-distribution-api-version"] {
            assert_eq!(ours.header(header), theirs.header(header), "{name}: {header}");
        }
        let manifest: Value = serde_json::from_slice(&ours.body).unwrap();
        let mut blobs = vec![manifest["config"].clone()];
        blobs.extend(manifest["layers"].as_array().unwrap().iter().cloned());
        for blob in blobs {
            let digest = blob["digest"].as_str().unwrap();
            let path = format!("/v2/{name}/blobs/{digest}");
            let (ours, theirs) =
                (oci(&address, "HEAD", &path, &[]).await, oci(&reference.address, "HEAD", &path, &[]).await);
            assert_eq!((ours.status, theirs.status), (200, 200), "{name} {digest}");
            for header in ["docker-content-digest", "content-length", "accept-ranges", "etag"] {
                assert_eq!(ours.header(header), theirs.header(header), "{name} {digest}: {header}");
            }
            assert_eq!(ours.header("content-length"), Some(blob["size"].to_string().as_str()));
        }
        digests.push((name.clone(), ours.header("docker-content-digest").unwrap().to_owned()));

        // The image: its index and both platforms' manifests, configs and layers, copied
        // whole (every digest checked), served the same by the reference registry. Without
        // `--preserve-digests`, skopeo gzips uncompressed layers on their way to a registry.
        let image = format!("docker://{address}/{name}:latest-image");
        let into_layout = format!("oci:{}:image", layout.display());
        let into_registry = format!("docker://{}/{name}:latest-image", reference.address);
        for destination in [into_layout, into_registry] {
            let (copy, all) = ("copy", "--all");
            let tls = ["--src-tls-verify=false", "--dest-tls-verify=false"];
            skopeo(&[&policy_arg, copy, all, "--preserve-digests", tls[0], tls[1], &image, &destination]);
        }
        let index_type = [("Accept", "application/vnd.oci.image.index.v1+json")];
        let path = format!("/v2/{name}/manifests/latest-image");
        let (ours, theirs) =
            (oci(&address, "GET", &path, &index_type).await, oci(&reference.address, "GET", &path, &index_type).await);
        assert_eq!((ours.status, theirs.status), (200, 200), "{name}");
        assert!(theirs.body == ours.body, "{name}: the reference registry serves another index");
        for header in ["docker-content-digest", "content-type", "content-length"] {
            assert_eq!(ours.header(header), theirs.header(header), "{name} index: {header}");
        }
        let index: Value = serde_json::from_slice(&ours.body).unwrap();
        let platforms: Vec<&str> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["platform"]["architecture"].as_str().unwrap())
            .collect();
        assert_eq!(platforms, ["amd64", "arm64"], "{name}");
        for platform in index["manifests"].as_array().unwrap() {
            let path = format!("/v2/{name}/manifests/{}", platform["digest"].as_str().unwrap());
            let manifest_type = [("Accept", "application/vnd.oci.image.manifest.v1+json")];
            let (ours, theirs) = (
                oci(&address, "GET", &path, &manifest_type).await,
                oci(&reference.address, "GET", &path, &manifest_type).await,
            );
            assert!(ours.status == 200 && theirs.body == ours.body, "{name}: {path}");
            let manifest: Value = serde_json::from_slice(&ours.body).unwrap();
            let config = oci(
                &address,
                "GET",
                &format!("/v2/{name}/blobs/{}", manifest["config"]["digest"].as_str().unwrap()),
                &[],
            )
            .await
            .json();
            let layers: Vec<&Value> = manifest["layers"].as_array().unwrap().iter().map(|l| &l["digest"]).collect();
            let diff_ids: Vec<&Value> = config["rootfs"]["diff_ids"].as_array().unwrap().iter().collect();
            assert_eq!(layers, diff_ids, "{name}: uncompressed layers are their own diff ids");
            for layer in manifest["layers"].as_array().unwrap() {
                assert_eq!(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar");
                let path = format!("/v2/{name}/blobs/{}", layer["digest"].as_str().unwrap());
                let (ours, theirs) =
                    (oci(&address, "HEAD", &path, &[]).await, oci(&reference.address, "HEAD", &path, &[]).await);
                assert_eq!((ours.status, theirs.status), (200, 200), "{name} {path}");
                for header in ["docker-content-digest", "content-length"] {
                    assert_eq!(ours.header(header), theirs.header(header), "{name} {path}: {header}");
                }
            }
        }
        images.push((name.clone(), ours.header("docker-content-digest").unwrap().to_owned()));
    }
    drop(reference);

    // The same versions give the same manifests and images after a restart, from the digest
    // store: no file is read to know them.
    let (again, _restarted) = serve(config).await;
    let hashed_before = common::metric("ztserve_file_digest_bytes_total", &[]);
    for ((name, digest), (_, image)) in digests.into_iter().zip(images) {
        let head = oci(&again, "HEAD", &format!("/v2/{name}/manifests/latest"), &[]).await;
        assert_eq!(head.header("docker-content-digest"), Some(digest.as_str()), "{name}");
        let by_digest = oci(&again, "GET", &format!("/v2/{name}/manifests/{digest}"), &[]).await;
        assert_eq!(by_digest.status, 200, "{name}");
        let head = oci(&again, "HEAD", &format!("/v2/{name}/manifests/latest-image"), &[]).await;
        assert_eq!(head.header("docker-content-digest"), Some(image.as_str()), "{name}");
    }
    assert_eq!(common::metric("ztserve_file_digest_bytes_total", &[]), hashed_before, "a file was hashed again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_clients_pull_every_model_from_a_local_directory() {
    registry_clients_pull_every_model(ModelSource::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_clients_pull_every_model_from_s3() {
    registry_clients_pull_every_model(ModelSource::s3()).await;
}

const FULL: &str = "full-access-token-0123456789";
const TEAM_A: &str = "team-a-only-token-0123456789";

/// Two small models, `team-a/m` and `team-b/m`, and a server that needs tokens: one for every
/// model, one for `team-a` only.
async fn gated_server(dir: &Path) -> (String, std::sync::Arc<ztserve::server::Server>, Vec<u8>) {
    let weights = common::noise(4096, 9);
    for team in ["team-a", "team-b"] {
        std::fs::create_dir_all(dir.join(team)).unwrap();
        std::fs::write(dir.join(team).join("m.zt"), common::model(&[("w", DType::U8, &weights, false)])).unwrap();
    }
    let mut config = Config::serving(vec![ztserve::config::SourceSpec::local(dir)]);
    config.auth.tokens =
        vec![TokenEntry::try_from(FULL.to_owned()).unwrap(), TokenEntry::try_from(format!("{TEAM_A} team-a")).unwrap()];
    let (address, server) = serve(config).await;
    (address, server, weights)
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_gate_the_registry_through_the_token_flow() {
    let dir = tempfile::tempdir().unwrap();
    let (address, _server, weights) = gated_server(dir.path()).await;

    // Anonymous: a challenge that sends the client to the token endpoint.
    let base = oci(&address, "GET", "/v2/", &[]).await;
    assert_eq!((base.status, code(&base).as_str()), (401, "UNAUTHORIZED"));
    let challenge = base.header("www-authenticate").unwrap();
    // The realm is at the host the request named (the test client sends `Host: x`).
    assert_eq!(challenge, r#"Bearer realm="http://x/v2/_token",service="ztserve""#);
    let manifest = oci(&address, "GET", "/v2/team-a/m/manifests/latest", &[]).await;
    assert!(manifest.header("www-authenticate").unwrap().ends_with(r#",scope="repository:team-a/m:pull""#));

    // The token endpoint takes the token as the password of basic credentials.
    assert_eq!(oci(&address, "GET", "/v2/_token", &[]).await.status, 401);
    let wrong = oci(&address, "GET", "/v2/_token", &[("Authorization", &basic("me", "not-a-token-at-all-0000"))]).await;
    assert_eq!(wrong.status, 401);
    let issued = oci(
        &address,
        "GET",
        "/v2/_token?service=ztserve&scope=repository:team-a/m:pull",
        &[("Authorization", &basic("me", TEAM_A))],
    )
    .await;
    assert_eq!(issued.status, 200, "{}", issued.head);
    let bearer = format!("Bearer {}", issued.json()["token"].as_str().unwrap());

    // A token's prefixes limit the catalog and pulls: another team's repository is denied,
    // whether or not it exists.
    let catalog = oci(&address, "GET", "/v2/_catalog", &[("Authorization", &bearer)]).await.json();
    assert_eq!(catalog["repositories"], json!(["team-a/m"]));
    let full = format!("Bearer {FULL}");
    assert_eq!(
        oci(&address, "GET", "/v2/_catalog", &[("Authorization", &full)]).await.json()["repositories"],
        json!(["team-a/m", "team-b/m"])
    );
    for (path, status, expected) in [
        ("/v2/team-a/m/manifests/latest", 200, ""),
        ("/v2/team-b/m/manifests/latest", 403, "DENIED"),
        ("/v2/team-b/nothing/manifests/latest", 403, "DENIED"),
        ("/v2/team-a/nothing/manifests/latest", 404, "NAME_UNKNOWN"),
    ] {
        let reply = oci(&address, "GET", path, &[("Authorization", &bearer)]).await;
        assert_eq!((reply.status, code(&reply).as_str()), (status, expected), "{path}");
    }
    // Basic credentials work on every route too, as some clients send them there.
    let direct = oci(&address, "GET", "/v2/team-a/m/tags/list", &[("Authorization", &basic("me", TEAM_A))]).await;
    assert_eq!(direct.status, 200);

    // oras logs in and pulls what the token may read, and is refused the rest.
    let bin = dir.path().join("w.bin");
    std::fs::write(&bin, &weights).unwrap();
    let version = direct.json()["tags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| *t != "latest" && !t.as_str().unwrap().ends_with("-image"))
        .unwrap()
        .clone();
    let plan = json!({
        "registry": address, "out": dir.path().join("pulled"), "token": TEAM_A, "denied": "team-b/m",
        "repos": { "team-a/m": { "version": version, "tensors": { "w": bin }, "companions": {} } },
    });
    let plan_path = dir.path().join("plan.json");
    std::fs::write(&plan_path, serde_json::to_vec(&plan).unwrap()).unwrap();
    assert_eq!(oci_clients("pull", &plan_path).await["tensors"], 1);
    let denied = oci_clients("denied", &plan_path).await;
    assert!(denied["message"].as_str().unwrap().contains("Forbidden"), "{denied}");

    // skopeo with --creds, right and wrong.
    let target = format!("docker://{address}/team-a/m:latest");
    skopeo(&["inspect", "--raw", "--tls-verify=false", "--creds", &format!("me:{TEAM_A}"), &target]);
    let refused = Command::new("skopeo")
        .args(["inspect", "--raw", "--tls-verify=false", "--creds", "me:not-a-token-at-all-0000", &target])
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_answers_as_the_distribution_spec_says() {
    let dir = tempfile::tempdir().unwrap();
    let weights = common::noise(5000, 2);
    std::fs::create_dir_all(dir.path().join("org")).unwrap();
    std::fs::write(dir.path().join("org/m.zt"), common::model(&[("w", DType::BF16, &weights, true)])).unwrap();
    std::fs::write(dir.path().join("org/m.config.json"), "{}").unwrap();
    std::fs::create_dir_all(dir.path().join("Org")).unwrap();
    std::fs::write(dir.path().join("Org/Big Model.zt"), common::model(&[("w", DType::U8, &weights, false)])).unwrap();
    let (address, _server) = serve(Config::serving(vec![ztserve::config::SourceSpec::local(dir.path())])).await;

    let base = oci(&address, "GET", "/v2/", &[]).await;
    assert_eq!((base.status, base.header("docker-distribution-api-version")), (200, Some("registry/2.0")));
    // An id that is not a repository name gets a hashed one, listed and pullable.
    let catalog = oci(&address, "GET", "/v2/_catalog", &[]).await.json();
    let names: Vec<&str> = catalog["repositories"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(names.len(), 2);
    assert_eq!(names[0], "org/m");
    assert!(names[1].starts_with("ztserve-id/"), "{names:?}");
    let hashed = oci(&address, "GET", &format!("/v2/{}/manifests/latest", names[1]), &[]).await;
    assert_eq!(hashed.status, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&hashed.body).unwrap()["annotations"]["org.opencontainers.image.title"],
        "Org/Big Model"
    );
    let page = oci(&address, "GET", "/v2/_catalog?n=1", &[]).await;
    assert_eq!(page.json()["repositories"], json!(["org/m"]));
    assert_eq!(page.header("link"), Some(r#"</v2/_catalog?n=1&last=org/m>; rel="next""#));
    let rest = oci(&address, "GET", "/v2/_catalog?n=1&last=org/m", &[]).await;
    assert_eq!((rest.json()["repositories"].as_array().unwrap().len(), rest.header("link")), (1, None));

    // The manifest and config: ModelPack's media types, the config's modelfs listing the layers.
    let reply = oci(&address, "GET", "/v2/org/m/manifests/latest", &[]).await;
    assert_eq!(reply.header("content-type"), Some("application/vnd.oci.image.manifest.v1+json"));
    let digest = reply.header("docker-content-digest").unwrap().to_owned();
    assert_eq!(digest, format!("sha256:{}", hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&reply.body))));
    let manifest: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(manifest["artifactType"], "application/vnd.cncf.model.manifest.v1+json");
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.cncf.model.config.v1+json");
    let layers = manifest["layers"].as_array().unwrap();
    let paths: Vec<&str> =
        layers.iter().map(|l| l["annotations"]["org.cncf.model.filepath"].as_str().unwrap()).collect();
    assert_eq!(paths, ["m.config.json", "model.safetensors"]);
    assert_eq!(layers[0]["mediaType"], "application/vnd.cncf.model.weight.config.v1.raw");
    assert_eq!(layers[1]["mediaType"], "application/vnd.cncf.model.weight.v1.raw");
    let config_digest = manifest["config"]["digest"].as_str().unwrap();
    let config = oci(&address, "GET", &format!("/v2/org/m/blobs/{config_digest}"), &[]).await.json();
    assert_eq!(config["descriptor"]["name"], "org/m");
    assert_eq!(config["config"], json!({ "format": "safetensors", "paramSize": "2.5K", "precision": "bf16" }));
    let diff_ids: Vec<&Value> = layers.iter().map(|l| &l["digest"]).collect();
    assert_eq!(config["modelfs"], json!({ "type": "layers", "diffIds": diff_ids }));
    let view = request_async(&address, "/models/org/m/model.safetensors", &[]).await.body;
    let layer = oci(&address, "GET", &format!("/v2/org/m/blobs/{}", layers[1]["digest"].as_str().unwrap()), &[]).await;
    assert!(layer.body == view, "the weights layer is the safetensors view");
    let ranged = oci(
        &address,
        "GET",
        &format!("/v2/org/m/blobs/{}", layers[1]["digest"].as_str().unwrap()),
        &[("Range", "bytes=8-99")],
    )
    .await;
    assert_eq!((ranged.status, ranged.body.as_slice()), (206, &view[8..100]));
    let escaped = layers[1]["digest"].as_str().unwrap().replace(':', "%3A");
    assert!(oci(&address, "GET", &format!("/v2/org/m/blobs/{escaped}"), &[]).await.body == view, "an escaped digest");

    // By tag, by digest, HEAD, and conditionally.
    let version = oci(&address, "GET", "/v2/org/m/tags/list", &[]).await.json()["tags"][0].as_str().unwrap().to_owned();
    let first_tag = oci(&address, "GET", "/v2/org/m/tags/list?n=1", &[]).await;
    assert_eq!(first_tag.json(), json!({ "name": "org/m", "tags": [version] }));
    assert_eq!(first_tag.header("link"), Some(&*format!(r#"</v2/org/m/tags/list?n=1&last={version}>; rel="next""#)));
    let last_tag = oci(&address, "GET", "/v2/org/m/tags/list?n=1&last=latest", &[]).await;
    assert_eq!((last_tag.json()["tags"].clone(), last_tag.header("link")), (json!(["latest-image"]), None));
    let tags = oci(&address, "GET", "/v2/org/m/tags/list", &[]).await.json();
    assert_eq!(tags["tags"], json!([version, format!("{version}-image"), "latest", "latest-image"]));
    for reference in [version.as_str(), digest.as_str()] {
        let by = oci(&address, "GET", &format!("/v2/org/m/manifests/{reference}"), &[]).await;
        assert!(by.status == 200 && by.body == reply.body, "{reference}");
    }
    let head = oci(&address, "HEAD", "/v2/org/m/manifests/latest", &[]).await;
    assert_eq!(
        (head.status, head.body.len(), head.header("content-length")),
        (200, 0, Some(reply.body.len().to_string().as_str()))
    );
    let etag = reply.header("etag").unwrap().to_owned();
    assert_eq!(oci(&address, "GET", "/v2/org/m/manifests/latest", &[("If-None-Match", &etag)]).await.status, 304);

    // The image: an index by its tags (for clients that take one), each platform's manifest
    // and config by digest, and each layer a tar of one file under models/, with ranges.
    let index_type = ("Accept", "application/vnd.oci.image.index.v1+json");
    let index = oci(&address, "GET", &format!("/v2/org/m/manifests/{version}-image"), &[index_type]).await;
    assert_eq!((index.status, index.header("content-type")), (200, Some(index_type.1)));
    let index_digest = index.header("docker-content-digest").unwrap().to_owned();
    let latest = oci(&address, "GET", "/v2/org/m/manifests/latest-image", &[index_type]).await;
    assert!(latest.body == index.body);
    let by_digest = oci(&address, "GET", &format!("/v2/org/m/manifests/{index_digest}"), &[]).await;
    assert!(by_digest.body == index.body, "an index by its digest");
    let platform = index.json()["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let image = oci(&address, "GET", &format!("/v2/org/m/manifests/{platform}"), &[]).await;
    assert_eq!(image.header("content-type"), Some("application/vnd.oci.image.manifest.v1+json"));
    let image = image.json();
    let image_config = image["config"]["digest"].as_str().unwrap();
    let image_config = oci(&address, "GET", &format!("/v2/org/m/blobs/{image_config}"), &[]).await;
    assert_eq!(image_config.header("content-type"), Some("application/vnd.oci.image.config.v1+json"));
    assert_eq!(image_config.json()["os"], "linux");
    let image_layers = image["layers"].as_array().unwrap();
    assert_eq!(image_layers.len(), 2, "one layer per published file");
    let weights_layer = format!("/v2/org/m/blobs/{}", image_layers[1]["digest"].as_str().unwrap());
    let tar = oci(&address, "GET", &weights_layer, &[]).await;
    assert_eq!(tar.header("content-type"), Some("application/vnd.oci.image.layer.v1.tar"));
    assert_eq!(tar.body.len().to_string(), image_layers[1]["size"].to_string());
    let mut archive = tar::Archive::new(tar.body.as_slice());
    let entries: Vec<(String, Vec<u8>)> = archive
        .entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            (entry.path().unwrap().to_string_lossy().into_owned(), data)
        })
        .collect();
    assert_eq!(entries, [("models/".to_owned(), vec![]), ("models/model.safetensors".to_owned(), view.clone())]);
    let within = tar.body.len() - 1500..tar.body.len() - 3;
    let range = format!("bytes={}-{}", within.start, within.end - 1);
    let ranged = oci(&address, "GET", &weights_layer, &[("Range", &range)]).await;
    assert_eq!((ranged.status, ranged.body.as_slice()), (206, &tar.body[within]));
    let tag = tar.header("etag").unwrap().to_owned();
    assert_eq!(oci(&address, "GET", &weights_layer, &[("If-None-Match", &tag)]).await.status, 304);

    // Errors, each the spec's code.
    let zeros = format!("sha256:{}", "0".repeat(64));
    for (method, path, headers, status, expected) in [
        ("GET", "/v2/org/m/manifests/other", vec![], 404, "MANIFEST_UNKNOWN"),
        ("GET", "/v2/org/m/manifests/other-image", vec![], 404, "MANIFEST_UNKNOWN"),
        // An index is not served to a client that takes only manifests.
        (
            "GET",
            "/v2/org/m/manifests/latest-image",
            vec![("Accept", "application/vnd.oci.image.manifest.v1+json")],
            404,
            "MANIFEST_UNKNOWN",
        ),
        ("GET", &*format!("/v2/org/m/manifests/{zeros}"), vec![], 404, "MANIFEST_UNKNOWN"),
        (
            "GET",
            "/v2/org/m/manifests/latest",
            vec![("Accept", "application/vnd.docker.distribution.manifest.v2+json")],
            404,
            "MANIFEST_UNKNOWN",
        ),
        ("GET", "/v2/org/none/manifests/latest", vec![], 404, "NAME_UNKNOWN"),
        ("GET", "/v2/Org/m/manifests/latest", vec![], 404, "NAME_UNKNOWN"),
        ("GET", &*format!("/v2/org/m/blobs/{zeros}"), vec![], 404, "BLOB_UNKNOWN"),
        ("GET", "/v2/org/m/blobs/sha256:abc", vec![], 400, "DIGEST_INVALID"),
        ("GET", "/v2/org/m/blobs/md5:abc", vec![], 400, "DIGEST_INVALID"),
        ("PUT", "/v2/org/m/manifests/latest", vec![], 405, "UNSUPPORTED"),
        ("DELETE", "/v2/org/m/manifests/latest", vec![], 405, "UNSUPPORTED"),
        ("DELETE", &*format!("/v2/org/m/blobs/{zeros}"), vec![], 405, "UNSUPPORTED"),
        ("POST", "/v2/org/m/blobs/uploads/", vec![], 405, "UNSUPPORTED"),
        ("PATCH", "/v2/org/m/blobs/uploads/1", vec![], 405, "UNSUPPORTED"),
        ("GET", "/v2/org/m/other", vec![], 404, "UNSUPPORTED"),
    ] {
        let reply = oci(&address, method, path, &headers).await;
        assert_eq!((reply.status, code(&reply).as_str()), (status, expected), "{method} {path}");
        assert_eq!(reply.header("docker-distribution-api-version"), Some("registry/2.0"), "{method} {path}");
        if status == 405 {
            assert_eq!(reply.header("allow"), Some("GET, HEAD"), "{method} {path}");
        }
    }

    // Referrers: an empty index.
    let referrers = oci(&address, "GET", &format!("/v2/org/m/referrers/{digest}"), &[]).await;
    assert_eq!(referrers.header("content-type"), Some("application/vnd.oci.image.index.v1+json"));
    assert_eq!(
        referrers.json(),
        json!({ "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [] })
    );
}
