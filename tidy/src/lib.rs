//! Readers of Rust source for the tidy checks of `tests/tidy.rs`: blanking out comments and
//! literals, lines of code per function and per file, and the graph of a crate's modules with
//! its cycles ([`modules`]). Std only and no dependencies, so the checks build in seconds.

pub mod modules;

/// Blanks out comments, string and char literals (keeping newlines), so braces in them do not
/// count.
pub fn strip_literals(text: &str) -> String {
    blank_out(text, false)
}

/// Lines of code of `text`: lines that are neither blank nor only a comment (a line inside a
/// string literal counts).
pub fn code_lines(text: &str) -> usize {
    blank_out(text, true).lines().filter(|l| !l.trim().is_empty()).count()
}

/// Blanks out comments (keeping newlines), and string and char literals too unless
/// `keep_literals`.
fn blank_out(text: &str, keep_literals: bool) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' || keep_literals { c } else { ' ' };
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
                out.push(if chars[i] == '\n' { '\n' } else { ' ' });
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
            out.push(blank(c));
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let step = if chars[i] == '\\' { 2 } else { 1 };
                for ch in &chars[i..(i + step).min(chars.len())] {
                    out.push(blank(*ch));
                }
                i += step;
            }
            out.push(blank('"'));
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
            for ch in &chars[i..=j.min(chars.len() - 1)] {
                out.push(blank(*ch));
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
pub fn function_lengths(text: &str) -> Vec<(String, usize)> {
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
