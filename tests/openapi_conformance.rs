//! schemathesis (from PyPI, in the venv `scripts/test` makes) against the real `ztserve serve`
//! binary on the demo models: every route, parameter, status, header and body must match
//! `openapi.yaml`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_running_server_conforms_to_openapi_yaml() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let schemathesis = common::venv_root().join("tools/bin/schemathesis");
    assert!(schemathesis.exists(), "{} is missing: run scripts/test", schemathesis.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_ztserve"))
        .args(["serve", "--listen", "127.0.0.1:0", "--source"])
        .arg(root.join("models"))
        .env("RUST_LOG", "info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    // The server logs its bound address; port 0 lets the kernel pick a free one. The log is
    // read on a thread (and kept drained, so the server never blocks on a full pipe), and the
    // wait for the address has a deadline.
    let (address_tx, address_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("address=").nth(1) {
                let _ = address_tx.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
            }
        }
    });
    let address = address_rx.recv_timeout(std::time::Duration::from_secs(30)).expect("server did not log its address within 30 s");
    let output = Command::new(&schemathesis)
        .args(["run", "openapi.yaml", "--url", &format!("http://{address}"), "--checks", "all"])
        .args(["--max-examples", "40", "--seed", "20261121", "--no-color"])
        .current_dir(root)
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "schemathesis found issues:\n{report}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(report.contains("No issues found"), "{report}");
    drop(server);
}
