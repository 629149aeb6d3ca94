//! The layer rule of `src/lib.rs`'s module map, kept: layers import one way (server, tools and
//! pull -> the protocols -> transport and access -> service and artifacts -> catalog, decode,
//! digests, signing and served -> storage -> format, with api, config and telemetry beside
//! them), no module imports one above it or beside it in its layer (so the wire protocols never
//! name each other), the modules beside the layers import only format and each other, and
//! nothing below the protocols reaches `api` (routes, URLs, header names: they know no HTTP),
//! by any chain of imports. Inside every folder of both crates, and among the format crate's
//! top-level modules, no two rooms import each other by any chain; the protocols reach the
//! service only through its door, transport names nothing of the service, and no file is over
//! 600 lines.

use std::fs;
use std::path::Path;

/// Each module of the library and its layer, lowest first; `None`: beside the layers.
const LAYERS: &[(&str, Option<u8>)] = &[
    ("format", Some(0)),
    ("storage", Some(1)),
    ("catalog", Some(2)),
    ("decode", Some(2)),
    ("digests", Some(2)),
    ("signing", Some(2)),
    ("served", Some(2)),
    ("service", Some(3)),
    ("artifacts", Some(3)),
    ("transport", Some(4)),
    ("access", Some(4)),
    ("http", Some(5)),
    ("s3", Some(5)),
    ("hf", Some(5)),
    ("oci", Some(5)),
    ("server", Some(6)),
    ("tools", Some(6)),
    ("pull", Some(6)),
    ("api", None),
    ("config", None),
    ("telemetry", None),
];

fn layer(module: &str) -> Option<Option<u8>> {
    LAYERS.iter().find(|(name, _)| *name == module).map(|(_, layer)| *layer)
}

/// Whether `from` may import `to`.
fn may_import(from: &str, to: &str) -> bool {
    // Routes, URLs and header names are the protocols': what lies below them knows no HTTP.
    if to == "api" && layer(from).expect("a known module").is_some_and(|layer| layer <= 4) {
        return false;
    }
    match (layer(from).expect("a known module"), layer(to)) {
        (_, None) => panic!("{from} names crate::{to}, a module the layer rule does not know: add it to LAYERS"),
        (_, Some(None)) => true,
        (None, Some(Some(to))) => to == 0,
        (Some(from), Some(Some(to))) => to < from,
    }
}

/// The Rust files of top-level module `module` (`src/{module}.rs` or `src/{module}/`).
fn files_of(src: &Path, module: &str) -> Vec<std::path::PathBuf> {
    let single = src.join(format!("{module}.rs"));
    if single.exists() {
        return vec![single];
    }
    let mut files = Vec::new();
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The top-level modules `code` names (`crate::x`, `crate::{x, y::Z}`), outside comments. (No
/// module of the crate reaches the root by `super::`: see
/// `no_module_reaches_the_crate_root_by_super`.)
fn named_modules(code: &str) -> Vec<String> {
    let mut named = Vec::new();
    // A `use` group spread over lines is read as one line, so that its later lines are seen.
    let mut lines = Vec::new();
    let mut open = 0i32;
    for line in code.lines().map(str::trim_start).filter(|l| !l.starts_with("//")) {
        let line = line.split(" // ").next().unwrap_or(line);
        let depth = |l: &str| l.matches('{').count() as i32 - l.matches('}').count() as i32;
        if open > 0 {
            let joined: &mut String = lines.last_mut().unwrap();
            joined.push(' ');
            joined.push_str(line);
            open += depth(line);
        } else {
            lines.push(line.to_owned());
            open = if line.contains("use ") && !line.contains(';') { depth(line).max(0) } else { 0 };
        }
    }
    for line in &lines {
        for prefix in ["crate::"] {
            for (at, _) in line.match_indices(prefix) {
                let before = line[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest = &line[at + prefix.len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    // `crate::{a::X, b}`: the first name of each item at the group's own depth.
                    let mut depth = 0;
                    let mut item_start = true;
                    for (i, c) in group.char_indices() {
                        match c {
                            '{' => depth += 1,
                            '}' if depth == 0 => break,
                            '}' => depth -= 1,
                            ',' if depth == 0 => item_start = true,
                            c if item_start && (c.is_ascii_alphanumeric() || c == '_') => {
                                let name: String =
                                    group[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                                named.push(name);
                                item_start = false;
                            }
                            c if !c.is_whitespace() => item_start = false,
                            _ => {}
                        }
                    }
                    continue;
                }
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty()
                    && (rest[name.len()..].starts_with("::")
                        || rest[name.len()..].starts_with([';', ',', '}', ' ', ')']))
                {
                    named.push(name);
                }
            }
        }
    }
    named
}

#[test]
fn no_module_imports_one_above_it_or_beside_it_in_its_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut broken = Vec::new();
    for (module, _) in LAYERS.iter().filter(|(name, _)| *name != "format") {
        for file in files_of(&src, module) {
            let code = fs::read_to_string(&file).unwrap();
            for named in named_modules(&code) {
                // Names that are items of the crate root rather than modules.
                if named == *module || layer(&named).is_none() && named.chars().next().is_some_and(char::is_uppercase) {
                    continue;
                }
                if !may_import(module, &named) {
                    broken.push(format!("{}: {module} imports {named}", file.display()));
                }
            }
        }
    }
    broken.sort();
    broken.dedup();
    assert!(broken.is_empty(), "imports that run up or across a layer:\n{}", broken.join("\n"));
}

#[test]
fn the_rule_sees_imports_in_every_form() {
    let code = "use crate::service::Service;\nuse crate::{format::gguf::{a, b}, config};\n\
                let x = crate::hf::app(); // crate::oci\n// crate::server in a comment\n\
                pub(crate) use crate::{\n    storage::{\n        Store,\n    },\n    digests,\n};\n";
    assert_eq!(named_modules(code), ["service", "format", "config", "hf", "storage", "digests"]);
    assert!(may_import("http", "service") && may_import("service", "config") && may_import("api", "format"));
    assert!(!may_import("service", "tools") && !may_import("http", "s3") && !may_import("config", "storage"));
    assert!(!may_import("service", "api") && !may_import("transport", "api") && may_import("hf", "api"));
}

/// Below the protocols nothing reaches `api`, not even through a module beside the layers
/// (telemetry, config): the protocols hand route names down as data.
#[test]
fn nothing_below_the_protocols_reaches_api_by_any_chain_of_imports() {
    use std::collections::{BTreeMap, BTreeSet};
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // `format` is a crate of its own: it names nothing of this one.
    let imports: BTreeMap<&str, BTreeSet<String>> = LAYERS
        .iter()
        .filter(|(name, _)| *name != "format")
        .map(|(module, _)| {
            let named = files_of(&src, module)
                .iter()
                .flat_map(|file| named_modules(&fs::read_to_string(file).unwrap()))
                .filter(|named| named != module && layer(named).is_some())
                .collect();
            (*module, named)
        })
        .collect();
    let mut reaching = Vec::new();
    for (module, _) in LAYERS.iter().filter(|(name, layer)| *name != "format" && layer.is_some_and(|l| l <= 4)) {
        let mut chains = vec![vec![module.to_string()]];
        let mut seen = BTreeSet::new();
        while let Some(chain) = chains.pop() {
            let last = chain.last().unwrap().as_str();
            for next in imports.get(last).into_iter().flatten() {
                let longer = [chain.clone(), vec![next.clone()]].concat();
                if next == "api" {
                    reaching.push(longer.join(" -> "));
                } else if seen.insert(next.clone()) {
                    chains.push(longer);
                }
            }
        }
    }
    assert!(reaching.is_empty(), "modules below the protocols that reach api:\n{}", reaching.join("\n"));
}

/// The modules of `folder` (each a file, or a folder of files) below a crate's `root`, and the
/// siblings each names, outside its tests: `super::x` in a module's own file (one `super::`
/// more for each folder deeper), or the folder's own path from `crate::`, anywhere.
fn folder_imports(
    root: &Path,
    folder: &Path,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    imports_of_rooms(root, folder, &std::collections::BTreeMap::new())
}

/// As [`folder_imports`], with a name the root re-exports (`aliases`: the item and the module
/// it comes from) counted as an import of that module.
fn imports_of_rooms(
    root: &Path,
    folder: &Path,
    aliases: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let modules: Vec<String> = fs::read_dir(folder)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let stem = path.file_stem()?.to_str()?.to_owned();
            // `mod.rs` and `lib.rs` are the folder's own; `fixture.rs` and `tests.rs` are its tests'.
            let module = path.is_dir() || path.extension().is_some_and(|e| e == "rs") && stem != "mod" && stem != "lib";
            (module && stem != "fixture" && stem != "tests").then_some(stem)
        })
        .collect();
    let relative = folder.strip_prefix(root).unwrap();
    let own_path: String = relative.components().map(|c| format!("{}::", c.as_os_str().to_str().unwrap())).collect();
    let sibling = "\u{1}";
    modules
        .iter()
        .map(|module| {
            let named = files_of(folder, module)
                .iter()
                .filter(|file| file.file_name().is_some_and(|name| name != "tests.rs"))
                .flat_map(|file| {
                    let code = fs::read_to_string(file).unwrap();
                    let code = without_test_modules(&code).replace(&format!("crate::{own_path}"), sibling);
                    let mut code = code.replace("crate::", "elsewhere::");
                    // How many folders below `folder` the file's module is: `x.rs` and
                    // `x/mod.rs` none, `x/y.rs` one, and so on.
                    let below = file.parent().unwrap().strip_prefix(folder).unwrap().components().count();
                    let depth = below - usize::from(below > 0 && file.file_name().is_some_and(|n| n == "mod.rs"));
                    for supers in (1..=depth + 6).rev() {
                        let to = if supers == depth + 1 { sibling } else { "elsewhere::" };
                        code = code.replace(&"super::".repeat(supers), to);
                    }
                    named_modules(&code.replace(sibling, "crate::"))
                })
                .map(|named| aliases.get(&named).cloned().unwrap_or(named))
                .filter(|named| named != module && modules.contains(named))
                .collect();
            (module.clone(), named)
        })
        .collect()
}

/// The chains of imports by which a module of `imports` reaches itself.
fn cycles_in(imports: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>) -> Vec<String> {
    let mut cycles = Vec::new();
    for start in imports.keys() {
        let mut chains = vec![vec![start.clone()]];
        let mut seen = std::collections::BTreeSet::new();
        while let Some(chain) = chains.pop() {
            for next in &imports[chain.last().unwrap()] {
                let longer = [chain.clone(), vec![next.clone()]].concat();
                if next == start {
                    cycles.push(longer.join(" -> "));
                } else if seen.insert(next.clone()) {
                    chains.push(longer);
                }
            }
        }
    }
    cycles
}

/// One type per concern needs one module per concern: no two modules of the service lean on
/// each other, by any chain of imports.
#[test]
fn the_modules_of_the_service_import_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let imports = folder_imports(&src, &src.join("service"));
    assert!(imports.len() >= 15, "only {} modules were found in src/service", imports.len());
    assert!(imports["hashing"].contains("published"), "the imports were not read: {imports:?}");
    let cycles = cycles_in(&imports);
    assert!(cycles.is_empty(), "modules of the service that import each other:\n{}", cycles.join("\n"));
}

/// The same in every folder of both crates, below their roots (the library's root is held by
/// the layer rule): no two rooms of one folder lean on each other.
#[test]
fn the_rooms_of_every_folder_import_each_other_without_a_cycle() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut folders = 0;
    let mut cycles = Vec::new();
    for root in [manifest.join("src"), manifest.join("format/src")] {
        let mut dirs: Vec<_> = fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
        while let Some(folder) = dirs.pop() {
            dirs.extend(fs::read_dir(&folder).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()));
            folders += 1;
            let found = cycles_in(&folder_imports(&root, &folder));
            cycles.extend(
                found.into_iter().map(|cycle| format!("{}: {cycle}", folder.strip_prefix(manifest).unwrap().display())),
            );
        }
    }
    assert!(folders >= 20, "only {folders} folders were found");
    assert!(cycles.is_empty(), "rooms of one folder that import each other:\n{}", cycles.join("\n"));
}

#[test]
fn the_rule_finds_a_cycle_between_two_rooms() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("room");
    fs::create_dir_all(folder.join("b")).unwrap();
    fs::write(folder.join("a.rs"), "use super::b::Thing;\n").unwrap();
    fs::write(folder.join("b/mod.rs"), "mod inner;\n").unwrap();
    fs::write(folder.join("b/inner.rs"), "use crate::room::a::X;\nuse super::super::c::Y;\n").unwrap();
    fs::write(folder.join("c.rs"), "use super::super::elsewhere::Z;\n").unwrap();
    let imports = folder_imports(dir.path(), &folder);
    assert_eq!(cycles_in(&imports), ["a -> b -> a", "b -> a -> b"], "{imports:?}");
    assert!(imports["b"].contains("c") && imports["c"].is_empty(), "{imports:?}");
}

/// The items a crate's `lib.rs` under `root` re-exports (`pub use model::{Manifest, DType};`),
/// each with the module it comes from: an import of `crate::Manifest` is an import of `model`.
fn root_reexports(root: &Path) -> std::collections::BTreeMap<String, String> {
    let code = fs::read_to_string(root.join("lib.rs")).unwrap();
    let code: String = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut aliases = std::collections::BTreeMap::new();
    for statement in code.split(';') {
        let statement = statement.trim();
        let Some(path) = ["pub use ", "pub(crate) use "].iter().find_map(|p| statement.strip_prefix(p)) else {
            continue;
        };
        let path = path.trim_start_matches("crate::").trim_start_matches("self::");
        let mut words = path.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty());
        let Some(module) = words.next() else { continue };
        for word in words.filter(|w| !matches!(*w, "as" | "self")) {
            aliases.insert(word.to_owned(), module.to_owned());
        }
    }
    aliases
}

/// The format crate's own root (its top-level modules) is held by no layer table: no two of
/// them lean on each other, by any chain of imports, not even through the root's re-exports.
#[test]
fn the_modules_of_the_format_crate_import_each_other_without_a_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("format/src");
    let imports = imports_of_rooms(&root, &root, &root_reexports(&root));
    assert!(imports.len() >= 15, "only {} modules were found in format/src", imports.len());
    assert!(imports["decode"].contains("error"), "the imports were not read: {imports:?}");
    let cycles = cycles_in(&imports);
    assert!(cycles.is_empty(), "modules of the format crate that import each other:\n{}", cycles.join("\n"));
}

#[test]
fn the_rule_finds_a_cycle_through_a_crate_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::create_dir_all(root.join("b")).unwrap();
    fs::write(root.join("lib.rs"), "mod a;\nmod b;\nmod c;\npub use a::{Thing, other as Other};\n").unwrap();
    fs::write(root.join("a.rs"), "use super::{c::Y, Result};\n").unwrap();
    fs::write(root.join("b/mod.rs"), "mod inner;\n").unwrap();
    fs::write(root.join("b/inner.rs"), "use crate::Other;\nuse super::super::c::Y;\n").unwrap();
    fs::write(root.join("c.rs"), "use crate::{b::Z, Thing};\n").unwrap();
    let imports = imports_of_rooms(root, root, &root_reexports(root));
    // `Other` is `a`'s by the root's re-export; `Result` is nobody's.
    assert_eq!(format!("{imports:?}"), r#"{"a": {"c"}, "b": {"a", "c"}, "c": {"a", "b"}}"#);
    let cycles = cycles_in(&imports);
    assert_eq!(cycles, ["a -> c -> a", "a -> c -> b -> a", "b -> c -> b", "c -> b -> c", "c -> a -> c"]);
}

/// The calls of the service's sub-service accessors in the files of `src` outside
/// `src/service/`, as `file: accessor`: what the protocols and the server ask of the service
/// they ask its facade, so no `.representations()` and the like run past it.
fn sub_service_calls_outside_the_service(src: &Path) -> Vec<String> {
    const ACCESSORS: [&str; 7] =
        ["catalog", "catalogs", "representations", "publication", "hashing", "signatures", "prefetches"];
    let mut calls = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != src.join("service") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                let code = fs::read_to_string(&path).unwrap();
                let code: String = code
                    .lines()
                    .map(str::trim_start)
                    .filter(|l| !l.starts_with("//"))
                    .map(|l| l.split(" // ").next().unwrap_or(l))
                    .collect::<Vec<_>>()
                    .join(" ");
                // Split across lines by rustfmt (`service\n.hashing()`), a call is still one.
                let code: String = code.split_whitespace().collect();
                for accessor in ACCESSORS {
                    if code.contains(&format!(".{accessor}()")) {
                        calls.push(format!("{}: {accessor}()", path.strip_prefix(src).unwrap().display()));
                    }
                }
            }
        }
    }
    calls.sort();
    calls
}

/// The files of `src/transport/` that name the service: transport sits below the service's
/// callers and beside nothing of the domain, so it knows the service's answers only as the
/// data of `served`.
fn transport_files_naming_the_service(src: &Path) -> Vec<String> {
    let mut naming: Vec<String> = files_of(src, "transport")
        .into_iter()
        .filter(|file| named_modules(&fs::read_to_string(file).unwrap()).iter().any(|named| named == "service"))
        .map(|file| file.strip_prefix(src).unwrap().display().to_string())
        .collect();
    naming.sort();
    naming
}

/// The protocols reach the service through one door (`Service::listing`, `Listing::open` and
/// the facade's own methods): none reaches into its sub-services.
#[test]
fn nothing_outside_the_service_calls_its_sub_service_accessors() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let calls = sub_service_calls_outside_the_service(&src);
    assert!(calls.is_empty(), "sub-services reached past the service's facade:\n{}", calls.join("\n"));
}

#[test]
fn transport_names_nothing_of_the_service() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let naming = transport_files_naming_the_service(&src);
    assert!(naming.is_empty(), "files of transport that name crate::service:\n{}", naming.join("\n"));
}

#[test]
fn the_door_rules_see_what_they_forbid() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::create_dir_all(src.join("service")).unwrap();
    fs::create_dir_all(src.join("transport")).unwrap();
    fs::create_dir_all(src.join("http")).unwrap();
    fs::write(src.join("service/mod.rs"), "fn f(s: &S) { s.hashing().wait(); }\n").unwrap();
    fs::write(src.join("http/models.rs"), "let x = state\n    .service\n    .publication()\n    .files();\n").unwrap();
    fs::write(src.join("http/ops.rs"), "// state.service.signatures() in a comment\n").unwrap();
    fs::write(src.join("transport/respond.rs"), "use crate::{served::Guard, service::RangeSource};\n").unwrap();
    fs::write(src.join("transport/range.rs"), "// crate::service in a comment\n").unwrap();
    assert_eq!(sub_service_calls_outside_the_service(src), ["http/models.rs: publication()"]);
    assert_eq!(transport_files_naming_the_service(src), ["transport/respond.rs"]);
}

/// A room a newcomer can read whole: no file of either crate's sources is over 600 lines (a
/// concern that grows past it becomes a folder of rooms).
#[test]
fn no_file_of_either_crate_is_over_600_lines() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    let mut files = 0;
    for root in [manifest.join("src"), manifest.join("format/src")] {
        let mut dirs = vec![root];
        while let Some(dir) = dirs.pop() {
            for path in fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files += 1;
                    let lines = fs::read_to_string(&path).unwrap().lines().count();
                    if lines > 600 {
                        long.push(format!("{}: {lines} lines", path.strip_prefix(manifest).unwrap().display()));
                    }
                }
            }
        }
    }
    assert!(files >= 150, "only {files} files were found");
    assert!(long.is_empty(), "files over 600 lines:\n{}", long.join("\n"));
}

/// `code` up to its first test module (`#[cfg(test)]` before a `mod`): a test-only item
/// elsewhere in the file (`#[cfg(test)] fn`) does not hide the code after it.
fn without_test_modules(code: &str) -> &str {
    let mut at = 0;
    while let Some(found) = code[at..].find("#[cfg(test)]") {
        let start = at + found;
        let rest = code[start + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub(crate) ").or_else(|| rest.strip_prefix("pub ")).unwrap_or(rest);
        if rest.starts_with("mod ") {
            return &code[..start];
        }
        at = start + 1;
    }
    code
}

/// The files of `src` whose code climbs to the crate's root by `super::` (past their own
/// top-level module), where the layer rules, which read `crate::` paths, would not see what it
/// names.
fn files_climbing_to_the_root(src: &Path) -> Vec<String> {
    let mut climbing = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for path in fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let relative = path.strip_prefix(src).unwrap();
            if path.extension().is_none_or(|e| e != "rs")
                || relative == Path::new("lib.rs")
                || relative == Path::new("main.rs")
            {
                continue;
            }
            // How deep the file's module is: `x.rs` and `x/mod.rs` 1, `x/y.rs` 2.
            let depth = relative.components().count() - usize::from(relative.ends_with("mod.rs"));
            let code = fs::read_to_string(&path).unwrap();
            let code = without_test_modules(&code);
            let code: String = code.lines().map(str::trim_start).filter(|l| !l.starts_with("//")).collect();
            if code.contains(&"super::".repeat(depth)) {
                climbing.push(relative.display().to_string());
            }
        }
    }
    climbing.sort();
    climbing
}

#[test]
fn no_module_reaches_the_crate_root_by_super() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let climbing = files_climbing_to_the_root(&src);
    assert!(
        climbing.is_empty(),
        "files that reach the crate's root by super:: (name it crate::):\n{}",
        climbing.join("\n")
    );
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("transport")).unwrap();
    fs::write(dir.path().join("transport/respond.rs"), "use super::super::service::ServiceError;\n").unwrap();
    fs::write(dir.path().join("transport/mod.rs"), "use super::service::Guard;\nmod respond;\n").unwrap();
    fs::write(
        dir.path().join("transport/range.rs"),
        "use super::respond::Thing;\n#[cfg(test)]\nmod tests { use super::super::x; }\n",
    )
    .unwrap();
    fs::write(dir.path().join("server.rs"), "#[cfg(test)]\nfn helper() {}\nuse super::http;\n").unwrap();
    assert_eq!(files_climbing_to_the_root(dir.path()), ["server.rs", "transport/mod.rs", "transport/respond.rs"]);
}
