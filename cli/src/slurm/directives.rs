//! Directives in a script: the arguments of its `#SBATCH` lines (or `#SRUN`, ...), as Slurm
//! reads them before the first command.

/// The `#SBATCH` directives of `script` (or of another prefix, e.g. `#SRUN`): arguments from
/// every line that starts with the prefix and whitespace, up to the first line that is neither
/// blank nor a comment. Quotes group, a backslash escapes, and an unquoted `#` starts a comment.
pub fn directives(script: &str, prefix: &str) -> Vec<String> {
    let mut args = Vec::new();
    for line in script.lines() {
        if let Some(rest) = line.strip_prefix(prefix) {
            if rest.is_empty() || !rest.starts_with(|c: char| c.is_whitespace()) {
                continue;
            }
            args.extend(split_directive(rest));
            continue;
        }
        let t = line.trim_start();
        if !t.is_empty() && !t.starts_with('#') {
            break;
        }
    }
    args
}

fn split_directive(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut have = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                    have = true;
                }
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                have = true;
            }
            (None, '#') => break,
            (None, c) if c.is_whitespace() => {
                if have {
                    out.push(std::mem::take(&mut cur));
                    have = false;
                }
            }
            (None, c) => {
                cur.push(c);
                have = true;
            }
        }
    }
    if have {
        out.push(cur);
    }
    out
}
