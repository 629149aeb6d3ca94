//! The manual stays true to the repository: every relative link and anchor in the README and
//! `docs/` resolves inside the repository, and every setting the manual names exists in
//! `config/ztserve.toml`, which lists each setting, and each setting there is in the manual; the
//! test sets it gives split the suite; every route of the HTTP contract is in `openapi.yaml`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The manual: the README, every page of `docs/`, and the other Markdown pages it links.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md"), root().join("SECURITY.md"), root().join("bench/README.md")];
    pages.push(root().join("clients/python/README.md"));
    pages.push(root().join("clients/vllm/README.md"));
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// `text` without its fenced code blocks and inline code spans, where `[a](b)` is no link.
fn prose(text: &str) -> String {
    let mut kept = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let unquoted: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
            kept.push_str(&unquoted);
            kept.push('\n');
        }
    }
    kept
}

/// Each link target `[text](target)` of `text`'s prose.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut found = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        found.push(after[..end].to_owned());
        rest = &after[end..];
    }
    found
}

/// The anchors GitHub gives `text`'s headings: lowercase, punctuation but `-` and `_` dropped,
/// spaces as `-`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#').trim().to_lowercase();
        let slug: String = heading
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        found.insert(slug);
    }
    found
}

#[test]
fn every_relative_link_and_anchor_of_the_manual_resolves_inside_the_repository() {
    let root = root().canonicalize().unwrap();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
            let shown = format!("{} links {target:?}", page.strip_prefix(&root).unwrap_or(&page).display());
            let resolved = file.canonicalize().unwrap_or_else(|_| panic!("{shown}: no such file"));
            assert!(resolved.starts_with(&root), "{shown}: outside the repository");
            if !anchor.is_empty() {
                let headings = anchors(&std::fs::read_to_string(&resolved).unwrap());
                assert!(headings.contains(anchor), "{shown}: no heading has that anchor");
            }
            checked += 1;
        }
    }
    assert!(checked >= 40, "only {checked} links were found");
}

/// Every setting of `config/ztserve.toml` as `section.key`, set or shown commented out.
fn settings() -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join("config/ztserve.toml")).unwrap();
    let mut section = String::new();
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_owned();
            continue;
        }
        let assignment = line.strip_prefix("# ").unwrap_or(line);
        let Some((key, _)) = assignment.split_once(" = ") else { continue };
        if !section.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
            found.insert(format!("{section}.{key}"));
        }
    }
    found
}

/// The settings `text` names, as `section.key`: written `` `section.key` ``, `` `[section] key` ``
/// or `ZTSERVE_SECTION__KEY`, for a section the configuration has.
fn named_settings(text: &str, sections: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for span in text.split('`').skip(1).step_by(2) {
        let dotted =
            span.split_once('.').filter(|(s, k)| sections.contains(*s) && !k.is_empty() && k.chars().all(word));
        let bracketed = span
            .strip_prefix('[')
            .and_then(|s| s.split_once("] "))
            .filter(|(s, k)| sections.contains(*s) && !k.is_empty() && k.chars().all(word));
        if let Some((section, key)) = dotted.or(bracketed) {
            found.insert(format!("{section}.{key}"));
        }
    }
    for (at, _) in text.match_indices("ZTSERVE_") {
        let name: String = text[at + "ZTSERVE_".len()..].chars().take_while(|c| word(*c)).collect();
        if let Some((section, key)) = name.to_lowercase().split_once("__") {
            if sections.contains(section) && !key.is_empty() {
                found.insert(format!("{section}.{key}"));
            }
        }
    }
    found
}

#[test]
fn every_setting_the_manual_names_is_in_config_ztserve_toml_and_every_one_there_is_in_the_manual() {
    let settings = settings();
    let sections: BTreeSet<String> = settings.iter().map(|s| s.split_once('.').unwrap().0.to_owned()).collect();
    assert!(settings.len() >= 50, "only {} settings were read from config/ztserve.toml", settings.len());
    let mut named = BTreeSet::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for setting in named_settings(&text, &sections) {
            assert!(
                settings.contains(&setting),
                "{} names {setting}, which config/ztserve.toml has not",
                page.display()
            );
            named.insert(setting);
        }
    }
    let unnamed: Vec<&String> = settings.difference(&named).collect();
    assert!(unnamed.is_empty(), "settings the manual never names: {unnamed:?}");
}

/// The hermetic and external sets of `.config/nextest.toml` are complements, and
/// docs/development.md gives the command of each.
#[test]
fn the_hermetic_and_external_test_sets_split_the_suite_as_the_manual_says() {
    let config: toml::Table =
        toml::from_str(&std::fs::read_to_string(root().join(".config/nextest.toml")).unwrap()).unwrap();
    let filter = |profile: &str| config["profile"][profile]["default-filter"].as_str().unwrap().trim().to_owned();
    let external = filter("external");
    assert_eq!(filter("hermetic"), format!("not (\n{external}\n)"));
    let manual = std::fs::read_to_string(root().join("docs/development.md")).unwrap();
    let section = manual.split("## Hermetic tests").nth(1).expect("a section \"Hermetic tests\"");
    for profile in ["hermetic", "external"] {
        let command = format!("cargo nextest run --workspace --all-targets --profile {profile}");
        assert!(section.contains(&format!("```sh\n{command}\n```")), "docs/development.md gives {command}");
    }
}

/// Every route the router declares for the HTTP contract (the Hub's, the registry's and the
/// artifact store's prefixes are labels, their routes described path by path) is a path of
/// `openapi.yaml`.
#[test]
fn every_http_route_is_a_path_of_openapi_yaml() {
    let spec = std::fs::read_to_string(root().join("openapi.yaml")).unwrap();
    let paths: BTreeSet<&str> = spec.lines().filter_map(|l| l.strip_prefix("  /")?.strip_suffix(':')).collect();
    let labels = [ztserve::api::routes::HUB, ztserve::api::routes::OCI, ztserve::api::routes::ARTIFACTS];
    for route in ztserve::api::routes::ALL.iter().filter(|r| !r.starts_with("/hf") && !r.starts_with("/v2")) {
        if labels.contains(route) {
            continue;
        }
        // axum's `{*name}` (a rest of the path) is an OpenAPI `{name}`.
        let path = route[1..].replace("{*", "{");
        assert!(paths.contains(path.as_str()), "{route} is routed but not a path of openapi.yaml");
    }
}
