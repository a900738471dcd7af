//! A `getopt_long` work-alike with glibc's messages, since Slurm's tools print whatever
//! getopt says: `sbatch: unrecognized option '--foo'`, `sbatch: invalid option -- 'Z'`, ...

use super::SlurmError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// A flag.
    No,
    /// `--opt VALUE`, `--opt=VALUE`, `-oVALUE`, `-o VALUE`.
    Required,
    /// Only `--opt=VALUE` or `-oVALUE`.
    Optional,
}

#[derive(Clone, Copy, Debug)]
pub struct OptDef {
    pub long: &'static str,
    pub short: Option<char>,
    pub arg: Arg,
}

pub const fn opt(long: &'static str, short: Option<char>, arg: Arg) -> OptDef {
    OptDef { long, short, arg }
}

/// Options found, by long name, in the order given; and the operands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub opts: Vec<(&'static str, Option<String>)>,
    pub operands: Vec<String>,
}

impl Parsed {
    pub fn has(&self, name: &str) -> bool {
        self.opts.iter().any(|(n, _)| *n == name)
    }
    /// The last value given for `name`.
    pub fn last(&self, name: &str) -> Option<&str> {
        self.opts.iter().rev().find(|(n, _)| *n == name).and_then(|(_, v)| v.as_deref())
    }
    /// Every value given for `name`, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.opts.iter().filter(|(n, _)| *n == name).filter_map(|(_, v)| v.as_deref()).collect()
    }
}

/// Parses `args` (without argv\[0\]). With `stop_at_operand` (getopt's `+`), everything from
/// the first operand on is an operand, as sbatch and srun need; otherwise operands and
/// options may mix. `--` always ends the options. Unique prefixes of long options are
/// accepted, as getopt_long does.
pub fn parse(prog: &str, defs: &[OptDef], args: &[String], stop_at_operand: bool) -> Result<Parsed, SlurmError> {
    let mut out = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        i += 1;
        if a == "--" {
            out.operands.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(body) = a.strip_prefix("--") {
            let (name, value) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let def = find_long(prog, defs, name, a)?;
            let value = match (def.arg, value) {
                (Arg::No, Some(_)) => return Err(SlurmError::getopt(prog, format!("option '--{}' doesn't allow an argument", def.long))),
                (Arg::No, None) => None,
                (_, Some(v)) => Some(v),
                (Arg::Optional, None) => None,
                (Arg::Required, None) => match args.get(i) {
                    Some(v) => {
                        i += 1;
                        Some(v.clone())
                    }
                    None => return Err(SlurmError::getopt(prog, format!("option '--{}' requires an argument", def.long))),
                },
            };
            out.opts.push((def.long, value));
            continue;
        }
        if a.len() > 1 && a.starts_with('-') {
            let chars: Vec<char> = a.chars().skip(1).collect();
            let mut k = 0;
            while k < chars.len() {
                let c = chars[k];
                k += 1;
                let def =
                    defs.iter().find(|d| d.short == Some(c)).ok_or_else(|| SlurmError::getopt(prog, format!("invalid option -- '{c}'")))?;
                match def.arg {
                    Arg::No => out.opts.push((def.long, None)),
                    Arg::Optional | Arg::Required if k < chars.len() => {
                        out.opts.push((def.long, Some(chars[k..].iter().collect())));
                        k = chars.len();
                    }
                    Arg::Optional => out.opts.push((def.long, None)),
                    Arg::Required => match args.get(i) {
                        Some(v) => {
                            i += 1;
                            out.opts.push((def.long, Some(v.clone())));
                        }
                        None => return Err(SlurmError::getopt(prog, format!("option requires an argument -- '{c}'"))),
                    },
                }
            }
            continue;
        }
        if stop_at_operand {
            out.operands.extend(args[i - 1..].iter().cloned());
            break;
        }
        out.operands.push(a.clone());
    }
    Ok(out)
}

fn find_long<'a>(prog: &str, defs: &'a [OptDef], name: &str, whole: &str) -> Result<&'a OptDef, SlurmError> {
    if let Some(d) = defs.iter().find(|d| d.long == name) {
        return Ok(d);
    }
    let candidates: Vec<&OptDef> = if name.is_empty() { Vec::new() } else { defs.iter().filter(|d| d.long.starts_with(name)).collect() };
    match candidates.as_slice() {
        [] => Err(SlurmError::getopt(prog, format!("unrecognized option '{whole}'"))),
        [one] => Ok(one),
        many => {
            let names: Vec<String> = many.iter().map(|d| format!("'--{}'", d.long)).collect();
            Err(SlurmError::getopt(prog, format!("option '--{name}' is ambiguous; possibilities: {}", names.join(" "))))
        }
    }
}
