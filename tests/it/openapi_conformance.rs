//! schemathesis (from PyPI, in the venv `scripts/test` makes) against the real `ztserve serve`
//! binary on the demo models: every route, parameter, status, header and body must match
//! `openapi.yaml`, the artifact store's writes included. The server requires a bearer token, as
//! a production one would: schemathesis sends it, and its `ignored_auth` check makes sure
//! requests without it are refused.

use crate::common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_running_server_conforms_to_openapi_yaml() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let schemathesis = common::venv_root().join("tools/bin/schemathesis");
    assert!(schemathesis.exists(), "{} is missing: run scripts/test", schemathesis.display());
    const TOKEN: &str = "conformance-0123456789abcdef";
    // With an artifact store the token may write to, so its routes are exercised too.
    let artifacts = tempfile::tempdir().unwrap();
    let server = common::start_binary(
        &["serve", "--listen", "127.0.0.1:0", "--source", "models"],
        &[
            ("ZTSERVE_AUTH__TOKENS", TOKEN),
            ("ZTSERVE_ARTIFACTS__DIR", artifacts.path().to_str().unwrap()),
            ("ZTSERVE_ARTIFACTS__WRITERS", TOKEN),
            ("ZTSERVE_ARTIFACTS__ALLOW_UNSIGNED", "true"),
        ],
    );
    let address = server.address.clone();
    let output = Command::new(&schemathesis)
        .args([
            "--config-file",
            "tests/schemathesis.toml",
            "run",
            "openapi.yaml",
            "--url",
            &format!("http://{address}"),
            "--checks",
            "all",
        ])
        .args(["--max-examples", "40", "--seed", "20261121", "--no-color"])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .current_dir(root)
        .env("SCHEMATHESIS_HOOKS", "")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "schemathesis found issues:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(report.contains("No issues found"), "{report}");
    drop(server);
}
