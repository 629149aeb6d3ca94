//! The distribution project's registry (`docker-registry`, from apt) as a reference and as a
//! pull-through mirror, and a plain client for the OCI distribution API.

use std::path::Path;
use std::process::Command;

use super::{Reply, send, stop_gracefully};

/// `METHOD path` to the server at `address`, off the test's runtime.
pub async fn oci(address: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    let (address, method, path) = (address.to_owned(), method.to_owned(), path.to_owned());
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    tokio::task::spawn_blocking(move || {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        send(&address, &method, &path, &headers, b"")
    })
    .await
    .unwrap()
}

/// The distribution project's registry on 127.0.0.1, storing under `dir`, with `extra` (YAML)
/// added to its configuration; stopped when dropped.
pub struct ReferenceRegistry {
    child: std::process::Child,
    pub address: String,
}

impl Drop for ReferenceRegistry {
    fn drop(&mut self) {
        stop_gracefully(&mut self.child);
    }
}

pub async fn start_reference_registry(dir: &Path, extra: &str) -> ReferenceRegistry {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("127.0.0.1:{port}");
    let config = dir.join("registry.yml");
    let storage = dir.join("registry-data");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n{extra}",
            storage.display()
        ),
    )
    .unwrap();
    super::external("docker-registry");
    let child = Command::new("docker-registry")
        .args(["serve", config.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("docker-registry (apt) is installed by scripts/test");
    let registry = ReferenceRegistry { child, address };
    // Up once it answers its version check (bounded: a registry that never starts fails here).
    for _ in 0..600 {
        if std::net::TcpStream::connect(&registry.address).is_ok()
            && oci(&registry.address, "GET", "/v2/", &[]).await.status == 200
        {
            return registry;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("docker-registry did not answer on {}", registry.address);
}
