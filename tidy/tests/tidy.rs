//! Tidy checks over the source tree (as rust-analyzer's `tidy.rs`): each crate's dependencies
//! against the "must NOT" column of ARCHITECTURE.md (and none at all for tidy itself), a `//!`
//! header on every source file, no `unwrap()` outside tests, no function over [`FN_LINES_MAX`]
//! lines of code, no source file over [`FILE_LINES_MAX`], and no cycle between the modules of a
//! crate. Today's offenders are listed by name so the lists can only shrink: a new offender
//! fails, and so does a listed one that is no longer one (take it off the list).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use corral_tidy::modules::{module_of, shown, Graph};
use corral_tidy::{code_lines, function_lengths};

/// Lines of code (not blank, not only a comment) a function may have.
const FN_LINES_MAX: usize = 100;

/// Functions over [`FN_LINES_MAX`] lines today, as `path::name`. Only ever remove entries.
const LONG_FUNCTIONS: &[&str] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The workspace's crates, as their directories (the `members` of the root `Cargo.toml`).
const CRATES: &[&str] = &[
    "proto",
    "scheduler",
    "control",
    "state",
    "engine",
    "replay",
    "consensus",
    "transport",
    "node",
    "cli",
    "chaos",
    "tests",
    "compat",
    "tidy",
];

/// Every `.rs` file of the workspace's crates (their `src/`, `tests/`, `benches/`), sorted.
fn rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> =
        CRATES.iter().flat_map(|c| ["src", "tests", "benches"].map(|d| root().join(c).join(d))).filter(|d| d.is_dir()).collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read source dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// The dependency names of a crate's `[dependencies]` table (not dev-dependencies).
fn dependencies(krate: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(krate).join("Cargo.toml")).expect("read Cargo.toml");
    let mut deps = BTreeSet::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            if let Some(name) = line.split(['=', '.', ' ']).next() {
                deps.insert(name.trim().to_string());
            }
        }
    }
    deps
}

/// The dependency names of every dependency table of a crate's `Cargo.toml` (`[dependencies]`,
/// `[dev-dependencies]`, `[build-dependencies]`, target-specific ones, `[dependencies.x]`).
fn dependencies_in_any_table(krate: &str) -> BTreeSet<String> {
    dependency_names(&std::fs::read_to_string(root().join(krate).join("Cargo.toml")).expect("read Cargo.toml"))
}

/// The dependency names of every dependency table of the `Cargo.toml` text `text`.
fn dependency_names(text: &str) -> BTreeSet<String> {
    let mut deps = BTreeSet::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if let Some(header) = line.strip_prefix('[') {
            let header = header.trim_end_matches(']');
            let table = header.rsplit_once('.').filter(|(t, _)| t.ends_with("dependencies"));
            if let Some((_, name)) = table {
                deps.insert(name.to_string());
            }
            inside = header.ends_with("dependencies");
        } else if inside && !line.is_empty() && !line.starts_with('#') {
            if let Some(name) = line.split(['=', '.', ' ']).next() {
                deps.insert(name.trim().to_string());
            }
        }
    }
    deps
}

#[test]
fn the_dependency_reader_reads_every_table() {
    let text = "[package]\nname = \"x\"\n\n[dependencies]\na.workspace = true\n\n[dev-dependencies]\nb = \"1\"\n\n\
                [target.'cfg(unix)'.dependencies]\nc = { version = \"1\" }\n\n[build-dependencies.d]\nversion = \"1\"\n";
    assert_eq!(dependency_names(text), ["a", "b", "c", "d"].map(String::from).into());
    assert!(dependency_names("[package]\nname = \"x\"\n").is_empty());
}

#[test]
fn every_workspace_member_is_checked() {
    let text = std::fs::read_to_string(root().join("Cargo.toml")).expect("read the workspace Cargo.toml");
    let members = text.lines().find_map(|l| l.trim().strip_prefix("members")).expect("a `members = [...]` line");
    let members: BTreeSet<&str> = members.split('"').skip(1).step_by(2).collect();
    let walked: BTreeSet<&str> = CRATES.iter().copied().collect();
    assert_eq!(members, walked, "tidy walks the crates of CRATES: make it the workspace's `members`");
}

#[test]
fn crates_keep_out_of_what_architecture_md_forbids_them() {
    // (crate, dependencies it must not have), from ARCHITECTURE.md's code map.
    let forbidden: &[(&str, &[&str])] = &[
        ("proto", &["openraft", "rocksdb", "tokio", "quinn"]),
        ("scheduler", &["tokio", "rocksdb", "openraft", "rand", "consensus", "transport"]),
        ("compat", &["tokio", "rocksdb", "openraft"]),
        ("transport", &["openraft", "rocksdb", "consensus", "scheduler"]),
        ("cli", &["rocksdb", "consensus", "openraft", "chaos"]),
        ("node", &["chaos", "replay"]),
        // The state machine, the engine and the replay build without RocksDB's C++ and run no IO.
        ("state", &["rocksdb", "openraft", "tokio", "consensus", "transport", "rand"]),
        ("engine", &["rocksdb", "openraft", "tokio", "consensus", "transport", "rand"]),
        ("replay", &["rocksdb", "openraft", "tokio", "consensus", "transport", "node"]),
        // The simulator drives the state machine and the pure decisions, not the Raft store.
        ("chaos", &["rocksdb", "consensus", "openraft", "tokio"]),
    ];
    let mut broken = Vec::new();
    for (krate, must_not) in forbidden {
        let deps = dependencies(krate);
        for dep in must_not.iter().filter(|d| deps.contains(**d)) {
            broken.push(format!("{krate} depends on {dep}"));
        }
    }
    // `control` holds pure decisions: nothing but the wire types and the pure scheduler.
    let control: Vec<String> = dependencies("control").into_iter().filter(|d| d != "proto" && d != "scheduler").collect();
    if !control.is_empty() {
        broken.push(format!("control depends on {control:?}"));
    }
    // Tidy builds in seconds with std alone: no dependencies in any table, dev and build too.
    let tidy = dependencies_in_any_table("tidy");
    if !tidy.is_empty() {
        broken.push(format!("tidy depends on {tidy:?} (it takes none at all, so it builds in seconds)"));
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

#[test]
fn every_source_file_opens_with_a_header_comment() {
    let missing: Vec<String> = rust_files()
        .into_iter()
        .filter(|f| !std::fs::read_to_string(f).expect("read source").trim_start().starts_with("//!"))
        .map(|f| rel(&f))
        .collect();
    assert!(missing.is_empty(), "files without a `//!` header saying what they are for: {missing:#?}");
}

/// The code of a file outside its `#[cfg(test)]` module (by convention the last item).
fn product_code(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |at| &text[..at])
}

/// Whether `path` (relative to the root) holds only tests or test helpers.
fn is_test_file(path: &str) -> bool {
    path.contains("/tests/")
        || path.contains("/benches/")
        || path.ends_with("/tests.rs")
        || path.ends_with("testkit.rs")
        || path.contains("fuzzing")
}

#[test]
fn no_unwrap_outside_tests() {
    let mut found = Vec::new();
    for file in rust_files() {
        let path = rel(&file);
        if is_test_file(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        for (n, line) in product_code(&text).lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            if code.contains(".unwrap()") {
                found.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "unwrap() outside tests (use expect with why it cannot fail, or handle the error): {found:#?}");
}

#[test]
fn the_function_counter_reads_rust_as_written() {
    let text = "fn a() {\n    let s = \"}\";\n    let c = '{';\n    // }\n    let r = r#\"}\"#;\n}\n\nfn b<'x>(v: &'x str) -> &'x str {\n    v\n}\nfn c();\n";
    assert_eq!(function_lengths(text), vec![("a".to_string(), 5), ("b".to_string(), 3)]);
}

#[test]
fn no_function_grows_past_the_limit() {
    let mut long: BTreeMap<String, usize> = BTreeMap::new();
    for file in rust_files() {
        let path = rel(&file);
        if is_test_file(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        for (name, loc) in function_lengths(product_code(&text)) {
            if loc > FN_LINES_MAX {
                long.insert(format!("{path}::{name}"), loc);
            }
        }
    }
    let listed: BTreeSet<&str> = LONG_FUNCTIONS.iter().copied().collect();
    let new: Vec<String> = long.iter().filter(|(k, _)| !listed.contains(k.as_str())).map(|(k, v)| format!("{k} ({v} lines)")).collect();
    let fixed: Vec<&str> = listed.iter().filter(|k| !long.contains_key(**k)).copied().collect();
    println!("functions over {FN_LINES_MAX} lines: {}", long.len());
    assert!(new.is_empty(), "functions over {FN_LINES_MAX} lines of code (split them): {new:#?}");
    assert!(fixed.is_empty(), "no longer over {FN_LINES_MAX} lines: take them off LONG_FUNCTIONS: {fixed:#?}");
}

/// Lines of code (not blank, not only a comment) a source file may have outside its tests.
const FILE_LINES_MAX: usize = 800;

/// Source files over [`FILE_LINES_MAX`] lines of code today, with their count then. Only ever
/// lower a count or remove an entry.
const LONG_FILES: &[(&str, usize)] = &[];

#[test]
fn no_file_grows_past_the_limit() {
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for file in rust_files() {
        let path = rel(&file);
        if is_test_file(&path) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read source");
        sizes.insert(path, code_lines(product_code(&text)));
    }
    let listed: BTreeMap<&str, usize> = LONG_FILES.iter().copied().collect();
    let mut wrong = Vec::new();
    for (path, &lines) in sizes.iter().filter(|(_, lines)| **lines > FILE_LINES_MAX) {
        match listed.get(path.as_str()) {
            None => wrong.push(format!(
                "{path} has {lines} lines of code, over {FILE_LINES_MAX}: split it into modules (a file that is \
                 over today goes in LONG_FILES with its count, and only shrinks from there)"
            )),
            Some(&max) if lines > max => wrong.push(format!(
                "{path} grew to {lines} lines of code, past its {max} in LONG_FILES: move code out of it (into a \
                 new module) rather than raise the entry"
            )),
            Some(&max) if lines < max => {
                println!("{path} is down to {lines} lines of code from {max}: lower its entry in LONG_FILES to {lines}")
            }
            Some(_) => {}
        }
    }
    for (path, max) in &listed {
        match sizes.get(*path) {
            None => wrong.push(format!("{path} (listed in LONG_FILES at {max}) is gone: remove its entry from LONG_FILES")),
            Some(&lines) if lines <= FILE_LINES_MAX => wrong.push(format!(
                "{path} is down to {lines} lines of code, within {FILE_LINES_MAX}: well done, remove its entry from LONG_FILES"
            )),
            Some(_) => {}
        }
    }
    let over = sizes.values().filter(|l| **l > FILE_LINES_MAX).count();
    println!("files over {FILE_LINES_MAX} lines of code: {over}");
    assert!(wrong.is_empty(), "source files over {FILE_LINES_MAX} lines of code:\n{}", wrong.join("\n"));
}

#[test]
fn the_line_counter_skips_blanks_and_comments() {
    let text = "//! Header.\n\nfn a() {\n    // a comment\n    /* a block\n       comment */\n    let s = \"\n\";\n    let t = \"// not a comment\";\n}\n";
    assert_eq!(code_lines(text), 5);
}

/// Module cycles of today, as (crate, its modules sorted). Only ever remove entries.
const MODULE_CYCLES: &[(&str, &[&str])] = &[];

/// The modules of each crate's library (or of its binary where it has no library), as (path,
/// module, code without tests). `src/bin/` holds crates of their own, and so does a `main.rs`
/// beside a `lib.rs`: they are left out.
fn crate_modules() -> BTreeMap<&'static str, Vec<(String, String, String)>> {
    let files = rust_files();
    let mut crates = BTreeMap::new();
    for krate in CRATES {
        let src = root().join(krate).join("src");
        let has_lib = src.join("lib.rs").is_file();
        let mut modules = Vec::new();
        for file in &files {
            let Ok(inside) = file.strip_prefix(&src) else {
                continue;
            };
            let inside = inside.display().to_string().replace('\\', "/");
            let path = rel(file);
            if inside.starts_with("bin/") || (has_lib && inside == "main.rs") || is_test_file(&path) {
                continue;
            }
            let text = std::fs::read_to_string(file).expect("read source");
            modules.push((path, module_of(&inside), product_code(&text).to_string()));
        }
        crates.insert(*krate, modules);
    }
    crates
}

#[test]
fn no_module_cycles_within_a_crate() {
    let mut found: BTreeMap<(String, Vec<String>), Vec<String>> = BTreeMap::new();
    for (krate, files) in crate_modules() {
        let files: Vec<(&str, &str, &str)> = files.iter().map(|(p, m, c)| (p.as_str(), m.as_str(), c.as_str())).collect();
        let graph = Graph::new(&files);
        for cycle in graph.cycles() {
            let edges = graph.edges_within(&cycle);
            found.insert((krate.to_string(), cycle.iter().map(|m| shown(m).to_string()).collect()), edges);
        }
    }
    let listed: BTreeSet<(String, Vec<String>)> =
        MODULE_CYCLES.iter().map(|(k, ms)| (k.to_string(), ms.iter().map(|m| m.to_string()).collect())).collect();
    let mut wrong = Vec::new();
    for ((krate, cycle), edges) in &found {
        if !listed.contains(&(krate.clone(), cycle.clone())) {
            wrong.push(format!(
                "{krate}: a new cycle between modules {cycle:?}; break it (move what both use into a module of its \
                 own, or pass it in) so that one depends on the other only. Its edges:\n    {}",
                edges.join("\n    ")
            ));
        }
    }
    for (krate, cycle) in &listed {
        if !found.contains_key(&(krate.clone(), cycle.clone())) {
            wrong.push(format!(
                "{krate}: the cycle {cycle:?} in MODULE_CYCLES is no longer there (broken, or its modules changed): \
                 remove its entry from MODULE_CYCLES (and list a changed one anew only if it cannot be broken)"
            ));
        }
    }
    println!("module cycles: {}", found.len());
    for ((krate, cycle), edges) in &found {
        println!("{krate} {cycle:?}:\n    {}", edges.join("\n    "));
    }
    assert!(wrong.is_empty(), "module cycles within a crate:\n{}", wrong.join("\n"));
}
