//! Tidy checks over the source tree (as rust-analyzer's `tidy.rs`): each crate's dependencies
//! against the "must NOT" column of ARCHITECTURE.md, a `//!` header on every source file, no
//! `unwrap()` outside tests, and no function over [`FN_LINES_MAX`] lines of code. Today's
//! offenders are listed by name so the lists can only shrink: a new offender fails, and so does
//! a listed one that is no longer one (take it off the list).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lines of code (not blank, not only a comment) a function may have.
const FN_LINES_MAX: usize = 100;

/// Functions over [`FN_LINES_MAX`] lines today, as `path::name`. Only ever remove entries.
const LONG_FUNCTIONS: &[&str] = &[];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Every `.rs` file of the workspace's crates (their `src/`, `tests/`, `benches/`), sorted.
fn rust_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> =
        ["proto", "scheduler", "control", "state", "engine", "replay", "consensus", "transport", "node", "cli", "chaos", "tests", "compat"]
            .iter()
            .flat_map(|c| ["src", "tests", "benches"].map(|d| root().join(c).join(d)))
            .filter(|d| d.is_dir())
            .collect();
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

/// Blanks out comments, string and char literals (keeping newlines), so braces in them do not
/// count.
fn strip_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                out.push(blank(chars[i]));
                i += 1;
            }
            out.push_str("  ");
            i += 2;
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            for ch in &chars[i..j.min(chars.len())] {
                out.push(blank(*ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let step = if chars[i] == '\\' { 2 } else { 1 };
                for ch in &chars[i..(i + step).min(chars.len())] {
                    out.push(blank(*ch));
                }
                i += step;
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A char literal ('x', '\n', '\''); a lifetime ('a) has no closing quote.
            let mut j = i + 1;
            if chars.get(j) == Some(&'\\') {
                j += 2;
            } else {
                j += 1;
            }
            while j < chars.len() && chars[j] != '\'' {
                j += 1;
            }
            for _ in i..=j.min(chars.len() - 1) {
                out.push(' ');
            }
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Functions of `text` and their lines of code, as (name, lines).
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let code = strip_literals(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    let mut n = 0;
    while n < lines.len() {
        let line = lines[n].trim_start();
        let after_fn = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "async fn ",
            "pub async fn ",
            "pub(crate) async fn ",
            "const fn ",
            "pub const fn ",
            "unsafe fn ",
        ]
        .iter()
        .find_map(|p| line.strip_prefix(p));
        let Some(rest) = after_fn else {
            n += 1;
            continue;
        };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        // The body opens at the first `{` after the signature; a `;` first means no body.
        let (mut depth, mut opened, mut end) = (0i64, false, n);
        'scan: for (k, l) in lines.iter().enumerate().skip(n) {
            for ch in l.chars() {
                match ch {
                    ';' if !opened && depth == 0 => {
                        end = k;
                        break 'scan;
                    }
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => {
                        depth -= 1;
                        if opened && depth == 0 {
                            end = k;
                            break 'scan;
                        }
                    }
                    _ => {}
                }
            }
            end = k;
        }
        if opened {
            let loc = lines[n..=end].iter().filter(|l| !l.trim().is_empty()).count();
            found.push((name, loc));
        }
        // Nested functions are counted within their parent; go on after the body.
        n = end + 1;
    }
    found
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
