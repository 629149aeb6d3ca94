use std::collections::BTreeMap;
use std::path::Path;

use super::load::shape;
use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn load(file: Option<&Path>, pairs: &[(&str, &str)]) -> Result<Loaded, ConfigError> {
    Config::load(file, env(pairs), BTreeMap::new())
}

const TOKEN: &str = "tok-0123456789abcdef";

#[test]
fn debug_output_never_shows_secrets() {
    let config = Config {
        s3_source: S3Source {
            access_key_id: Some("AKIDEXAMPLE".into()),
            secret_access_key: Some("wJalrXUtnFEMI".into()),
            ..S3Source::default()
        },
        auth: Auth { tokens: vec![TokenEntry::parse(TOKEN).unwrap()], ..Auth::default() },
        ..Config::default()
    };
    let shown = format!("{config:?}");
    assert!(!shown.contains(TOKEN) && !shown.contains("wJalrXUtnFEMI"), "{shown}");
    assert!(shown.contains("AKIDEXAMPLE") && shown.contains("<redacted>"));
}

#[test]
fn defaults_load_without_a_file() {
    let loaded = load(None, &[]).unwrap();
    assert_eq!(loaded.config, Config::default());
    assert!(loaded.notices.is_empty());
}

#[test]
fn layers_override_in_order_defaults_file_env_flags() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    let file = "[server]\nlisten = \"0.0.0.0:9000\"\n[limits]\nmax_ranges = 5\n[sources]\nrescan_interval_secs = 7\n";
    std::fs::write(&path, file).unwrap();
    let flags = BTreeMap::from([("server.listen".to_string(), toml::Value::String("127.0.0.1:9100".into()))]);
    let vars = env(&[
        ("ZTSERVE_LIMITS__MAX_RANGES", "9"),
        ("ZTSERVE_SOURCES__PATHS", "a, b"),
        ("ZTSERVE_SERVER__LISTEN", "127.0.0.1:9050"),
    ]);
    let c = Config::load(Some(&path), vars, flags).unwrap().config;
    assert_eq!(c.server.listen.to_string(), "127.0.0.1:9100", "flag beats env and file");
    assert_eq!(c.limits.max_ranges, 9, "env beats file");
    assert_eq!(c.sources.rescan_interval_secs, 7, "file beats default");
    assert_eq!(c.sources.paths, [SourceSpec::local("a"), SourceSpec::local("b")]);
    assert_eq!(c.limits.max_concurrent_requests, Limits::default().max_concurrent_requests);
}

#[test]
fn every_key_is_a_section_and_key_in_the_environment_with_a_double_underscore() {
    for (section, keys) in shape() {
        for key in keys.as_table().unwrap().keys() {
            let var = env_name(&section, key);
            assert!(var.starts_with("ZTSERVE_") && var.contains("__"), "{var}");
            assert_eq!(
                var["ZTSERVE_".len()..].to_ascii_lowercase().split_once("__"),
                Some((section.as_str(), key.as_str()))
            );
        }
    }
    let c =
        load(None, &[("ZTSERVE_S3_SOURCE__ENDPOINT", "http://minio:9000"), ("ZTSERVE_DECODE__MAX_CONCURRENT", "3")])
            .unwrap()
            .config;
    assert_eq!((c.s3_source.endpoint.as_deref(), c.decode.max_concurrent), (Some("http://minio:9000"), Some(3)));
    let e = load(None, &[("ZTSERVE_LIMITS__MAX_RANGERS", "3")]).unwrap_err().to_string();
    assert!(e.contains("ZTSERVE_LIMITS__MAX_RANGERS") && e.contains("no such configuration key"), "{e}");
    // Variables that are not configuration (the client's token, the tests' own) are left alone.
    assert!(load(None, &[("ZTSERVE_TOKEN", "x"), ("ZTSERVE_VENVS", "/v")]).is_ok());
}

#[test]
fn the_flat_names_of_earlier_releases_still_work_and_are_each_reported_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "max_ranges = 5\ns3_listen = \"\"\nrequest_timeout_secs = 0\n[decode]\nwait_ms = 7\n")
        .unwrap();
    let loaded = load(
        Some(&path),
        &[
            ("ZTSERVE_SOURCES", "s3://models"),
            ("ZTSERVE_S3_ENDPOINT", "http://minio:9000"),
            ("ZTSERVE_S3_REGION", ""),
            ("ZTSERVE_MAX_CONCURRENT_DECODES", "0"),
            ("ZTSERVE_S3_LISTEN", "0.0.0.0:9000"),
        ],
    )
    .unwrap();
    let c = &loaded.config;
    assert_eq!(c.limits.max_ranges, 5);
    assert_eq!(c.limits.request_timeout_secs, None, "0 was no limit");
    assert_eq!(c.decode.wait_ms, 7);
    assert_eq!(c.decode.max_concurrent, None, "0 was one per core");
    assert_eq!(c.sources.paths, [SourceSpec::S3 { bucket: "models".into(), prefix: String::new() }]);
    assert_eq!(c.s3_source.endpoint.as_deref(), Some("http://minio:9000"));
    assert_eq!(c.s3_source.region, None, "\"\" was off");
    assert_eq!(c.s3_endpoint.listen, Some(SocketAddr::from(([0, 0, 0, 0], 9000))), "env beats the file's \"\"");
    assert_eq!(loaded.notices.len(), 8, "{:?}", loaded.notices);
    assert!(loaded.notices.iter().any(|n| n.contains("\"max_ranges\"") && n.contains("max_ranges in [limits]")));
    assert!(
        loaded.notices.iter().any(|n| n.contains("ZTSERVE_S3_ENDPOINT is deprecated: use ZTSERVE_S3_SOURCE__ENDPOINT"))
    );
}

#[test]
fn keys_that_moved_to_remote_are_read_from_their_old_section_and_each_is_told_its_new_name_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "[s3_source]\nrange_chunk_bytes = 1048576\nretries = 2\n").unwrap();
    let loaded =
        load(Some(&path), &[("ZTSERVE_S3_SOURCE__RANGE_CONCURRENCY", "4"), ("ZTSERVE_S3_READAHEAD_BYTES", "65536")])
            .unwrap();
    let c = &loaded.config;
    assert_eq!((c.remote.range_chunk_bytes, c.remote.range_concurrency, c.remote.readahead_bytes), (1 << 20, 4, 65536));
    assert_eq!(c.s3_source.retries, 2);
    let told = |old: &str, new: &str| loaded.notices.iter().filter(|n| n.contains(old) && n.contains(new)).count();
    assert_eq!(
        told("\"range_chunk_bytes\" in [s3_source]", "use range_chunk_bytes in [remote]"),
        1,
        "{:?}",
        loaded.notices
    );
    assert_eq!(told("ZTSERVE_S3_SOURCE__RANGE_CONCURRENCY", "use ZTSERVE_REMOTE__RANGE_CONCURRENCY"), 1);
    assert_eq!(told("ZTSERVE_S3_READAHEAD_BYTES", "use ZTSERVE_REMOTE__READAHEAD_BYTES"), 1);
    assert!(loaded.notices.iter().all(|n| n.ends_with("release 0.2.0 removes it")), "{:?}", loaded.notices);
    // An old name and its new one together are ambiguous, in the file as in the environment.
    std::fs::write(&path, "[s3_source]\nrange_chunk_bytes = 1\n[remote]\nrange_chunk_bytes = 2\n").unwrap();
    let e = load(Some(&path), &[]).unwrap_err().to_string();
    assert!(e.contains("remote.range_chunk_bytes is set twice"), "{e}");
}

#[test]
fn an_old_name_and_its_new_one_together_are_refused_as_ambiguous() {
    let e = load(None, &[("ZTSERVE_SOURCES", "a"), ("ZTSERVE_SOURCES__PATHS", "b")]).unwrap_err().to_string();
    assert!(e.contains("sources.paths is set by ZTSERVE_SOURCES too"), "{e}");
    // Never with a secret's value, nor one under a name that is no key.
    for vars in [
        [("ZTSERVE_TOKENS", TOKEN), ("ZTSERVE_AUTH__TOKENS", "other-token-0123456789")],
        [("ZTSERVE_AUTH__TOKEN", TOKEN), ("ZTSERVE_X", "")],
    ] {
        let e = load(None, &vars).unwrap_err().to_string();
        assert!(!e.contains(TOKEN) && !e.contains("other-token"), "{e}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "max_ranges = 5\n[limits]\nmax_ranges = 6\n").unwrap();
    let e = load(Some(&path), &[]).unwrap_err().to_string();
    assert!(e.contains("limits.max_ranges is set twice"), "{e}");
}

#[test]
fn off_is_a_key_left_out_and_the_request_timeout_says_none() {
    let c = Config::default();
    assert_eq!((c.s3_endpoint.listen, c.auth.token_file.as_ref(), c.decode.max_concurrent), (None, None, None));
    assert_eq!(c.limits.request_timeout_secs, Some(600));
    let c = load(None, &[("ZTSERVE_LIMITS__REQUEST_TIMEOUT_SECS", "none")]).unwrap().config;
    assert_eq!(c.limits.request_timeout_secs, None);
    for (var, value, key) in [
        ("ZTSERVE_LIMITS__REQUEST_TIMEOUT_SECS", "0", "limits.request_timeout_secs"),
        ("ZTSERVE_DECODE__MAX_CONCURRENT", "0", "decode.max_concurrent"),
        ("ZTSERVE_S3_SOURCE__REGION", "", "s3_source.region"),
        ("ZTSERVE_AUTH__TOKEN_FILE", "", "auth.token_file"),
        ("ZTSERVE_S3_ENDPOINT__LISTEN", "nowhere", "s3_endpoint.listen"),
        ("ZTSERVE_LIMITS__MAX_RANGES", "none", "limits.max_ranges"),
    ] {
        let e = load(None, &[(var, value)]).unwrap_err().to_string();
        assert!(e.contains(key), "{var}={value:?}: {e}");
    }
}

#[test]
fn tokens_are_parsed_and_checked_as_the_configuration_loads_never_repeating_one() {
    let c = load(None, &[("ZTSERVE_AUTH__TOKENS", &format!("{TOKEN} team-a/ org/vision"))]).unwrap().config;
    assert_eq!(
        c.auth.tokens,
        [TokenEntry { token: TOKEN.into(), prefixes: vec!["team-a".into(), "org/vision".into()] }]
    );
    for (entry, expected) in [
        ("short", "at least 16"),
        ("has\"quote0123456789", "characters"),
        ("=0123456789abcdefgh", "characters"),
        (&format!("{TOKEN} ../etc"), "prefix"),
        (&format!("{TOKEN} a//b"), "prefix"),
    ] {
        let e = load(None, &[("ZTSERVE_AUTH__TOKENS", entry)]).unwrap_err().to_string();
        assert!(e.contains("auth.tokens") && e.contains(expected), "{entry:?}: {e}");
        let token = entry.split_whitespace().next().unwrap();
        assert!(!e.contains(token), "{e} repeats the token");
    }
    assert_eq!(TokenEntry::parse("").unwrap_err(), "is empty");
}

#[test]
fn invalid_configuration_fails_with_the_key_and_its_origin() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, "lisen = \"x\"\n").unwrap();
    let e = load(Some(&path), &[]).unwrap_err().to_string();
    assert!(e.contains("unknown key \"lisen\""), "{e}");
    std::fs::write(&path, "[limits]\nmax_rangers = 3\n").unwrap();
    let e = load(Some(&path), &[]).unwrap_err().to_string();
    assert!(e.contains("unknown key \"limits.max_rangers\""), "{e}");
    std::fs::write(&path, "[limits]\nmax_ranges = \"many\"\n").unwrap();
    let e = load(Some(&path), &[]).unwrap_err().to_string();
    assert!(e.contains("limits.max_ranges (from config file"), "{e}");
    let e = load(None, &[("ZTSERVE_LIMITS__MAX_RANGES", "lots")]).unwrap_err().to_string();
    assert!(e.contains("ZTSERVE_LIMITS__MAX_RANGES") && e.contains("integer"), "{e}");
    let e = load(None, &[("ZTSERVE_SERVER__LISTEN", "nowhere")]).unwrap_err().to_string();
    assert!(e.contains("server.listen (from environment variable ZTSERVE_SERVER__LISTEN)"), "{e}");
    let e = load(None, &[("ZTSERVE_LISTEN", "nowhere")]).unwrap_err().to_string();
    assert!(e.contains("server.listen (from environment variable ZTSERVE_LISTEN)"), "{e}");
    let e = load(None, &[("ZTSERVE_SERVER__LOG_FORMAT", "xml")]).unwrap_err().to_string();
    assert!(e.contains("server.log_format"), "{e}");
    let e = load(None, &[("ZTSERVE_LIMITS__MAX_RANGES", "-1")]).unwrap_err().to_string();
    assert!(e.contains("max_ranges") || e.contains("configuration"), "{e}");
    assert!(load(Some(Path::new("/nonexistent/ztserve.toml")), &[]).is_err());
}

#[test]
fn the_artifact_store_takes_writers_from_the_environment_and_none_without_a_directory() {
    let writer = "writer-0123456789abcdef";
    let both = format!("{writer} vllm,other-writer-0123456789");
    let unsigned = ("ZTSERVE_ARTIFACTS__ALLOW_UNSIGNED", "true");
    let loaded =
        load(None, &[("ZTSERVE_ARTIFACTS__DIR", "/var/lib/a"), ("ZTSERVE_ARTIFACTS__WRITERS", &both), unsigned])
            .unwrap();
    let writers = &loaded.config.artifacts.writers;
    assert_eq!(writers.len(), 2);
    assert_eq!((writers[0].token.as_str(), writers[0].prefixes.as_slice()), (writer, &["vllm".to_owned()][..]));
    let e = load(None, &[("ZTSERVE_ARTIFACTS__WRITERS", writer)]).unwrap_err().to_string();
    assert!(e.contains("artifacts.writers") && e.contains("artifacts.dir"), "{e}");
    let e = load(None, &[("ZTSERVE_ARTIFACTS__WRITERS", "short")]).unwrap_err().to_string();
    assert!(e.contains("ZTSERVE_ARTIFACTS__WRITERS"), "{e}");
    let e = load(None, &[("ZTSERVE_ARTIFACTS__DIR", "/a"), ("ZTSERVE_ARTIFACTS__MAX_BYTES", "0")]).unwrap_err();
    assert!(e.to_string().contains("artifacts.max_bytes"), "{e}");
}

#[test]
fn signatures_identities_and_a_shared_bucket_need_what_they_rely_on() {
    let dir = ("ZTSERVE_ARTIFACTS__DIR", "/var/lib/a");
    let e = load(None, &[dir, ("ZTSERVE_ARTIFACTS__REQUIRE_SIGNATURE", "true")]).unwrap_err().to_string();
    assert!(e.contains("artifacts.require_signature") && e.contains("signing.public_keys"), "{e}");
    let keys = ("ZTSERVE_SIGNING__PUBLIC_KEYS", "/etc/keys/publisher.pub");
    let loaded = load(None, &[dir, ("ZTSERVE_ARTIFACTS__REQUIRE_SIGNATURE", "true"), keys]).unwrap();
    assert!(loaded.config.artifacts.require_signature);
    let e =
        load(None, &[dir, ("ZTSERVE_ARTIFACTS__WRITER_IDENTITIES", "uri:spiffe://a vllm")]).unwrap_err().to_string();
    assert!(e.contains("artifacts.writer_identities") && e.contains("tls.client_ca_file"), "{e}");
    // Writers need signatures required (or unsigned bundles allowed outright): else any writer
    // could squat a name.
    let writer = ("ZTSERVE_ARTIFACTS__WRITERS", "0123456789abcdef0123 vllm");
    let e = load(None, &[dir, writer]).unwrap_err().to_string();
    assert!(
        e.contains("artifacts.require_signature") && e.contains("squatting") && e.contains("allow_unsigned"),
        "{e}"
    );
    assert!(load(None, &[dir, writer, ("ZTSERVE_ARTIFACTS__ALLOW_UNSIGNED", "true")]).is_ok());
    assert!(load(None, &[dir, writer, ("ZTSERVE_ARTIFACTS__REQUIRE_SIGNATURE", "true"), keys]).is_ok());
    let both = [
        dir,
        writer,
        ("ZTSERVE_ARTIFACTS__REQUIRE_SIGNATURE", "true"),
        keys,
        ("ZTSERVE_ARTIFACTS__ALLOW_UNSIGNED", "true"),
    ];
    let e = load(None, &both).unwrap_err().to_string();
    assert!(e.contains("artifacts.allow_unsigned") && e.contains("require_signature"), "{e}");
    // An identity names the kind of name it must be, so one kind never passes for another.
    for untyped in ["spiffe://a vllm", "worker-a", "host:worker-a", "cn:"] {
        let e = load(None, &[dir, ("ZTSERVE_ARTIFACTS__WRITER_IDENTITIES", untyped)]).unwrap_err().to_string();
        assert!(e.contains("names no kind") && e.contains("cn:NAME"), "{untyped}: {e}");
    }
    let shared = load(None, &[dir, ("ZTSERVE_ARTIFACTS__S3", "s3://caches/prod")]).unwrap();
    let spec = SourceSpec::S3 { bucket: "caches".into(), prefix: "prod".into() };
    assert_eq!(shared.config.artifacts.s3, Some(spec));
    let e = load(None, &[dir, ("ZTSERVE_ARTIFACTS__S3", "/not/a/bucket")]).unwrap_err().to_string();
    assert!(e.contains("artifacts.s3") && e.contains("s3://bucket/prefix"), "{e}");
    let e = load(None, &[("ZTSERVE_ARTIFACTS__S3", "s3://caches/prod")]).unwrap_err().to_string();
    assert!(e.contains("artifacts.s3") && e.contains("artifacts.dir"), "{e}");
}

#[test]
fn sources_are_directories_or_a_bucket_with_an_optional_prefix() {
    let spec = |text: &str| SourceSpec::try_from(text.to_owned());
    let s3 = |bucket: &str, prefix: &str| SourceSpec::S3 { bucket: bucket.into(), prefix: prefix.into() };
    assert_eq!(spec("s3://models/prod/v1/"), Ok(s3("models", "prod/v1")));
    assert_eq!(spec("s3://models"), Ok(s3("models", "")));
    assert_eq!(spec("models"), Ok(SourceSpec::local("models")));
    assert!(spec("s3:///x").is_err() && spec("s3:models").is_err() && spec(" ").is_err());
    assert_eq!(s3("models", "prod/v1").to_string(), "s3://models/prod/v1");
    let hub = |repo: &str, revision: Option<&str>| SourceSpec::Hub {
        repo: repo.into(),
        revision: revision.map(str::to_owned),
    };
    assert_eq!(spec("hf://org/llama"), Ok(hub("org/llama", None)));
    assert_eq!(spec("hf://gpt2@v1.0"), Ok(hub("gpt2", Some("v1.0"))));
    assert_eq!(spec("hf://org/llama@refs/pr/1"), Ok(hub("org/llama", Some("refs/pr/1"))));
    for bad in [
        "hf://",
        "hf:org/llama",
        "hf://a/b/c",
        "hf://org/-x",
        "hf://org/a..b",
        "hf://org/x@",
        "hf://o/x@a b",
        "hf://o/x@../y",
    ] {
        assert!(spec(bad).is_err(), "{bad}");
    }
    assert_eq!(hub("org/llama", Some("refs/pr/1")).to_string(), "hf://org/llama@refs/pr/1");
    let e = load(None, &[("ZTSERVE_SOURCES__PATHS", "s3://")]).unwrap_err().to_string();
    assert!(
        e.contains("sources.paths (from environment variable ZTSERVE_SOURCES__PATHS)") && e.contains("s3://bucket"),
        "{e}"
    );
}

#[test]
fn the_documented_config_file_lists_every_key_with_its_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/ztserve.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let documented: toml::Table = toml::from_str(&text).unwrap();
    let defaults = toml::Table::try_from(Config::default()).unwrap();
    assert_eq!(documented, defaults, "config/ztserve.toml must show every key at its default");
    // Every key, optional ones commented out with an example, under its section, with a
    // comment line above it.
    for (section, keys) in shape() {
        let start = text.lines().position(|l| l == format!("[{section}]")).unwrap_or_else(|| panic!("[{section}]"));
        let body: Vec<&str> = text.lines().skip(start + 1).take_while(|l| !l.starts_with('[')).collect();
        for key in keys.as_table().unwrap().keys() {
            let line = body
                .iter()
                .position(|l| l.starts_with(&format!("{key} =")) || l.starts_with(&format!("# {key} =")))
                .unwrap_or_else(|| panic!("{key} is not documented in [{section}]"));
            assert!(line > 0 && body[line - 1].starts_with('#'), "{section}.{key} needs a comment line above it");
        }
    }
}

#[test]
fn signing_is_set_from_the_environment_and_refused_without_trust_or_with_an_unknown_source() {
    let loaded = load(
        None,
        &[
            ("ZTSERVE_SOURCES__PATHS", "/models,s3://vetted/m"),
            ("ZTSERVE_SIGNING__POLICY", "if-signed"),
            ("ZTSERVE_SIGNING__PUBLIC_KEYS", "/k/a.pub, /k/b.pub"),
            ("ZTSERVE_SIGNING__CA_FILE", "/k/ca.pem"),
            ("ZTSERVE_SIGNING__SOURCE_POLICIES", "s3://vetted/m=required"),
        ],
    )
    .unwrap();
    let signing = &loaded.config.signing;
    assert_eq!(signing.public_keys, vec![PathBuf::from("/k/a.pub"), PathBuf::from("/k/b.pub")]);
    assert_eq!(signing.ca_file.as_deref(), Some(Path::new("/k/ca.pem")));
    assert_eq!(signing.policy_of("s3://vetted/m"), SigningPolicy::Required);
    assert_eq!(signing.policy_of("/models"), SigningPolicy::IfSigned);
    let refused = |pairs: &[(&str, &str)]| load(None, pairs).unwrap_err().to_string();
    let no_trust = refused(&[("ZTSERVE_SIGNING__POLICY", "required")]);
    assert!(no_trust.contains("signing.policy") && no_trust.contains("public_keys or signing.ca_file"), "{no_trust}");
    let unknown = refused(&[
        ("ZTSERVE_SIGNING__PUBLIC_KEYS", "/k/a.pub"),
        ("ZTSERVE_SIGNING__SOURCE_POLICIES", "/elsewhere=required"),
    ]);
    assert!(unknown.contains("signing.source_policies") && unknown.contains("/elsewhere"), "{unknown}");
    let bad = refused(&[("ZTSERVE_SIGNING__POLICY", "sometimes")]);
    assert!(bad.contains("signing.policy"), "{bad}");
    let bad = refused(&[("ZTSERVE_SIGNING__SOURCE_POLICIES", "models=maybe")]);
    assert!(bad.contains("signing.source_policies") && bad.contains("maybe"), "{bad}");
}

#[test]
fn lineages_are_a_list_in_the_environment_and_keeping_no_version_is_refused() {
    let loaded =
        load(None, &[("ZTSERVE_REFITS__LINEAGES", "a, org/b"), ("ZTSERVE_REFITS__KEEP_VERSIONS", "2")]).unwrap();
    assert_eq!(loaded.config.refits.lineages, ["a", "org/b"]);
    let written_as_an_array = load(None, &[("ZTSERVE_REFITS__LINEAGES", r#"["a", "org/b"]"#)]).unwrap();
    assert_eq!(written_as_an_array.config.refits.lineages, ["a", "org/b"]);
    let e = load(None, &[("ZTSERVE_REFITS__LINEAGES", "[1, 2]")]).unwrap_err().to_string();
    assert!(e.contains("ZTSERVE_REFITS__LINEAGES") && e.contains("array of strings"), "{e}");
    assert_eq!(loaded.config.refits.keep_versions, 2);
    assert_eq!(loaded.config.refits.ready_marker, "READY");
    let e = load(None, &[("ZTSERVE_REFITS__KEEP_VERSIONS", "0")]).unwrap_err().to_string();
    assert!(e.contains("refits.keep_versions") && e.contains("at least 1"), "{e}");
    let e = load(None, &[("ZTSERVE_REFITS__LINEAGES", "policy/")]).unwrap_err().to_string();
    assert!(e.contains("refits.lineages"), "{e}");
    let e = load(None, &[("ZTSERVE_REFITS__READY_MARKER", "a/READY")]).unwrap_err().to_string();
    assert!(e.contains("refits.ready_marker"), "{e}");
}
