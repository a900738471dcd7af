//! The graph of a crate's modules and its cycles. A module names another through `crate::`,
//! `super::` and `self::` paths, in `use` items (groups included) and in code; each path goes to
//! the longest module its prefix names. References between a module and its own ancestors or
//! descendants are left out (a parent declares and re-exports its children, a child uses its
//! parent's items): only those between modules where neither holds the other make edges.

use std::collections::{BTreeMap, BTreeSet};

/// The module a file of a crate's `src/` holds, from its path relative to `src/`: `lib.rs` and
/// `main.rs` hold the crate root (`""`), `a.rs` and `a/mod.rs` hold `a`, `a/b.rs` holds `a::b`.
pub fn module_of(src_path: &str) -> String {
    let path = src_path.strip_suffix(".rs").unwrap_or(src_path);
    let path = path.strip_suffix("/mod").unwrap_or(path);
    if path == "lib" || path == "main" {
        return String::new();
    }
    path.replace('/', "::")
}

/// Whether module `outer` is `inner` or one of its ancestors (the crate root `""` holds all).
fn holds(outer: &str, inner: &str) -> bool {
    outer.is_empty() || outer == inner || inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with("::"))
}

/// A crate's modules and the edges between modules where neither holds the other, each with
/// one place that makes it (`path:line: crate::a::b`).
#[derive(Debug, Default)]
pub struct Graph {
    pub modules: BTreeSet<String>,
    pub edges: BTreeMap<(String, String), String>,
}

impl Graph {
    /// The graph of a crate's `files`, as (path for messages, module, its code without tests).
    pub fn new(files: &[(&str, &str, &str)]) -> Graph {
        let modules: BTreeSet<String> = files.iter().map(|(_, module, _)| module.to_string()).collect();
        let mut edges = BTreeMap::new();
        for (path, module, code) in files {
            for (line, segments) in references(&crate::strip_literals(code)) {
                let Some(target) = resolve(module, &segments, &modules) else {
                    continue;
                };
                if holds(module, &target) || holds(&target, module) {
                    continue;
                }
                edges.entry((module.to_string(), target)).or_insert_with(|| format!("{path}:{line}: {}", segments.join("::")));
            }
        }
        Graph { modules, edges }
    }

    /// The strongly connected components of more than one module, each sorted, in order.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (from, to) in self.edges.keys() {
            next.entry(from.as_str()).or_default().push(to.as_str());
        }
        // Modules reachable from each module in one step or more; the graphs are small.
        let reach: BTreeMap<&str, BTreeSet<&str>> = self
            .modules
            .iter()
            .map(|start| {
                let mut seen = BTreeSet::new();
                let mut todo = vec![start.as_str()];
                while let Some(m) = todo.pop() {
                    for n in next.get(m).into_iter().flatten() {
                        if seen.insert(*n) {
                            todo.push(n);
                        }
                    }
                }
                (start.as_str(), seen)
            })
            .collect();
        let mut cycles = BTreeSet::new();
        for (m, from_m) in &reach {
            let component: Vec<String> =
                from_m.iter().filter(|n| reach.get(**n).is_some_and(|r| r.contains(m))).map(|n| n.to_string()).collect();
            if component.len() > 1 {
                cycles.insert(component);
            }
        }
        cycles.into_iter().collect()
    }

    /// The edges between the modules of `cycle`, as `a -> b (where)`.
    pub fn edges_within(&self, cycle: &[String]) -> Vec<String> {
        self.edges
            .iter()
            .filter(|((from, to), _)| cycle.contains(from) && cycle.contains(to))
            .map(|((from, to), at)| format!("{} -> {} ({at})", shown(from), shown(to)))
            .collect()
    }
}

/// A module's name for messages: the crate root shows as `crate`.
pub fn shown(module: &str) -> &str {
    if module.is_empty() {
        "crate"
    } else {
        module
    }
}

/// The module a path of `segments` used in `module` names: the longest of `modules` its prefix
/// names, or `None` for a path that does not start at `crate`, `super` or `self`.
fn resolve(module: &str, segments: &[String], modules: &BTreeSet<String>) -> Option<String> {
    let mut at: Vec<&str> = if module.is_empty() { Vec::new() } else { module.split("::").collect() };
    let mut rest = segments.iter().map(String::as_str).peekable();
    // A leading `self` stays where it is; a later one (`crate::a::{self}`) is spread out already.
    match rest.next()? {
        "crate" => at.clear(),
        "self" => {}
        "super" => {
            at.pop()?;
            while rest.next_if_eq(&"super").is_some() {
                at.pop()?;
            }
        }
        _ => return None,
    }
    let mut best = at.join("::");
    for segment in rest.filter(|s| *s != "self") {
        at.push(segment);
        let candidate = at.join("::");
        if !modules.contains(&candidate) {
            break;
        }
        best = candidate;
    }
    Some(best)
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether `word` starts at `chars[i]` as a whole word.
fn word_at(chars: &[char], i: usize, word: &str) -> bool {
    let len = word.chars().count();
    chars.len() >= i + len
        && chars[i..i + len].iter().copied().eq(word.chars())
        && !chars.get(i + len).copied().is_some_and(is_ident)
        && !(i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':'))
}

/// The `crate::`, `super::` and `self::` paths of `code` (literals and comments blanked out),
/// as (line, segments): those of `use` items, groups spread out, and those in code.
fn references(code: &str) -> Vec<(usize, Vec<String>)> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
        } else if !matches!(chars[i], 'u' | 'c' | 's') {
            // Not the start of `use`, `crate`, `super` or `self`: the quick way past most text.
        } else if word_at(&chars, i, "use") && chars.get(i + 3).is_some_and(|c| c.is_whitespace() || *c == '{') {
            let end = chars[i..].iter().position(|c| *c == ';').map_or(chars.len(), |at| i + at);
            let tree: String = chars[i + 3..end].iter().collect();
            let starts = ["crate", "super", "self"];
            found.extend(
                use_paths(&tree).into_iter().filter(|p| p.first().is_some_and(|s| starts.contains(&s.as_str()))).map(|p| (line, p)),
            );
            line += tree.matches('\n').count();
            i = end;
        } else if ["crate", "super", "self"].iter().any(|w| word_at(&chars, i, w)) {
            let (segments, end) = read_path(&chars, i);
            if segments.len() > 1 {
                found.push((line, segments));
            }
            i = end;
            continue;
        }
        i += 1;
    }
    found
}

/// The path `a::b::c` that starts at `chars[i]`, and where it ends.
fn read_path(chars: &[char], mut i: usize) -> (Vec<String>, usize) {
    let mut segments = Vec::new();
    loop {
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        segments.push(chars[start..i].iter().collect());
        let more = chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') && chars.get(i + 2).copied().is_some_and(is_ident);
        if !more {
            return (segments, i);
        }
        i += 2;
    }
}

/// A token of a `use` tree: a name, `::`, `{`, `}`, `,` or `*`.
#[derive(Debug, PartialEq)]
enum Token {
    Name(String),
    Punct(&'static str),
}

/// The paths a `use` tree (the text after `use`) brings in, groups spread out.
fn use_paths(tree: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = tree.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if is_ident(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            tokens.push(Token::Name(chars[start..i].iter().collect()));
            continue;
        }
        match c {
            ':' if chars.get(i + 1) == Some(&':') => {
                tokens.push(Token::Punct("::"));
                i += 1;
            }
            '{' => tokens.push(Token::Punct("{")),
            '}' => tokens.push(Token::Punct("}")),
            ',' => tokens.push(Token::Punct(",")),
            '*' => tokens.push(Token::Punct("*")),
            _ => {}
        }
        i += 1;
    }
    let mut paths = Vec::new();
    let mut at = 0;
    use_tree(&tokens, &mut at, &[], &mut paths);
    paths
}

/// Reads one use tree from `tokens[*at]` under `prefix` into `paths`.
fn use_tree(tokens: &[Token], at: &mut usize, prefix: &[String], paths: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    // `a::{self}` brings in `a` itself.
    let mut itself = false;
    while let Some(token) = tokens.get(*at) {
        match token {
            Token::Name(name) if name == "self" && !path.is_empty() => itself = true,
            Token::Name(name) if name == "as" => {
                // `as name`: the rename is not part of the path.
                *at += 2;
                break;
            }
            Token::Name(name) => path.push(name.clone()),
            Token::Punct("::") | Token::Punct("*") => {}
            Token::Punct("{") => {
                *at += 1;
                while *at < tokens.len() && tokens[*at] != Token::Punct("}") {
                    let before = *at;
                    use_tree(tokens, at, &path, paths);
                    if tokens.get(*at) == Some(&Token::Punct(",")) || *at == before {
                        *at += 1;
                    }
                }
                *at += 1;
                return;
            }
            Token::Punct(_) => break,
        }
        *at += 1;
    }
    if path.len() > prefix.len() || itself {
        paths.push(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cycles_of(files: &[(&str, &str, &str)]) -> Vec<Vec<String>> {
        Graph::new(files).cycles()
    }

    #[test]
    fn two_modules_naming_each_other_make_one_cycle() {
        let files = [
            ("src/lib.rs", "", "pub mod a;\npub mod b;\n"),
            ("src/a.rs", "a", "use crate::b::{Thing, other::More as M};\npub struct Other;\n"),
            ("src/b.rs", "b", "pub struct Thing;\nfn f() -> super::a::Other {\n    todo!()\n}\n"),
        ];
        assert_eq!(cycles_of(&files), vec![vec!["a".to_string(), "b".to_string()]]);
        let graph = Graph::new(&files);
        assert_eq!(
            graph.edges_within(&["a".to_string(), "b".to_string()]),
            vec!["a -> b (src/a.rs:1: crate::b::Thing)".to_string(), "b -> a (src/b.rs:2: super::a::Other)".to_string()]
        );
    }

    #[test]
    fn parents_and_children_make_no_cycle() {
        let files = [
            ("src/lib.rs", "", "pub mod a;\npub use a::b::Thing;\nfn f() { crate::a::b::g() }\n"),
            ("src/a/mod.rs", "a", "pub mod b;\nuse self::b::Thing;\npub struct Other;\n"),
            ("src/a/b.rs", "a::b", "use super::*;\nuse crate::a::Other;\npub struct Thing;\nfn g() { crate::f() }\n"),
        ];
        assert!(cycles_of(&files).is_empty());
        assert!(Graph::new(&files).edges.is_empty());
    }

    #[test]
    fn literals_comments_and_longer_words_name_nothing() {
        let files = [
            ("src/a.rs", "a", "// use crate::b::X;\nlet s = \"crate::b::X\";\nlet myself = notcrate::b::X;\n"),
            ("src/b.rs", "b", "use crate::a;\n"),
        ];
        assert!(cycles_of(&files).is_empty());
        assert_eq!(Graph::new(&files).edges.len(), 1);
    }

    #[test]
    fn modules_follow_file_paths() {
        assert_eq!(module_of("lib.rs"), "");
        assert_eq!(module_of("main.rs"), "");
        assert_eq!(module_of("a.rs"), "a");
        assert_eq!(module_of("a/mod.rs"), "a");
        assert_eq!(module_of("a/b.rs"), "a::b");
    }

    #[test]
    fn use_groups_spread_out() {
        let paths = use_paths(" crate::{a::{self, X as Y}, b::*, super::c}");
        let names: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(names, ["crate::a", "crate::a::X", "crate::b", "crate::super::c"]);
    }
}
