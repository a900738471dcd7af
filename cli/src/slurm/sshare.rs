//! `sshare`: each association's shares, decayed usage and Fair Tree factor, as Slurm 22.05
//! prints them. Usage is in GPU-seconds (Corral's fair share counts GPU time, a MIG slice by
//! its share of the GPU), where Slurm's default billing counts CPU-seconds.

use proto::accounts::ShareLine;
use proto::{ClientRequest, Reply};

use super::opts::{self, opt, Arg, OptDef};
use super::SlurmError;

const PROG: &str = "sshare";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// `-a`: every user; otherwise only the caller's (or `-u`'s) associations.
    pub all: bool,
    pub accounts: Vec<String>,
    pub users: Vec<String>,
    pub noheader: bool,
    pub long: bool,
    /// `-p` (`|` after every field) or `-P` (between fields only).
    pub parsable: Option<bool>,
}

const OPTIONS: &[OptDef] = &[
    opt("accounts", Some('A'), Arg::Required),
    opt("all", Some('a'), Arg::No),
    opt("long", Some('l'), Arg::No),
    opt("noheader", Some('n'), Arg::No),
    opt("parsable", Some('p'), Arg::No),
    opt("parsable2", Some('P'), Arg::No),
    opt("users", Some('u'), Arg::Required),
];

fn list(values: Vec<&str>) -> Vec<String> {
    values.iter().flat_map(|v| v.split(',')).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

pub fn parse(args: &[String]) -> Result<Options, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, false)?;
    if let Some(extra) = p.operands.first() {
        return Err(SlurmError::fatal(PROG, format!("Unknown argument: {extra} (Corral's sshare takes -a, -A, -u, -n, -l, -p, -P)")));
    }
    let parsable = if p.has("parsable2") { Some(false) } else { p.has("parsable").then_some(true) };
    Ok(Options {
        all: p.has("all"),
        accounts: list(p.all("accounts")),
        users: list(p.all("users")),
        noheader: p.has("noheader"),
        long: p.has("long"),
        parsable,
    })
}

/// The columns: header, width.
fn columns(long: bool) -> Vec<(&'static str, usize)> {
    let mut c = vec![("Account", 20), ("User", 10), ("RawShares", 10), ("NormShares", 11), ("RawUsage", 11)];
    if long {
        c.push(("NormUsage", 11));
    }
    c.extend([("EffectvUsage", 13), ("FairShare", 10)]);
    if long {
        c.push(("LevelFS", 10));
    }
    c
}

fn ratio(ppm: u64) -> String {
    format!("{}.{:06}", ppm / 1_000_000, ppm % 1_000_000)
}

/// The lines `o` selects: accounts on the way to a selected user's association, and those
/// associations (every user with `-a`; with `-A`, only under those accounts).
fn selected<'a>(lines: &'a [ShareLine], o: &Options, me: &str) -> Vec<&'a ShareLine> {
    let wants_user = |u: &str| if o.users.is_empty() { o.all || u == me } else { o.users.iter().any(|x| x == u) };
    let wants_account = |a: &str| o.accounts.is_empty() || o.accounts.iter().any(|x| x == a);
    lines
        .iter()
        .filter(|l| match &l.user {
            Some(u) => wants_user(u) && wants_account(&l.account),
            None => wants_account(&l.account) || l.depth == 0 && o.accounts.is_empty(),
        })
        .collect()
}

pub fn render(lines: &[ShareLine], o: &Options, me: &str) -> String {
    let cols = columns(o.long);
    let root_usage = lines.first().map_or(0, |l| l.usage_gpu_s);
    let mut out = String::new();
    let mut row = |cells: Vec<String>, header: bool| {
        let n = cells.len();
        for (k, (cell, (_, width))) in cells.into_iter().zip(&cols).enumerate() {
            match o.parsable {
                Some(trailing) => {
                    out.push_str(&cell);
                    if trailing || k + 1 < n {
                        out.push('|');
                    }
                }
                // The account is left-aligned under a right-aligned header, as Slurm prints it.
                None if k == 0 && !header => out.push_str(&format!("{cell:<width$.width$} ")),
                None => out.push_str(&format!("{cell:>width$.width$} ")),
            }
        }
        out.push('\n');
    };
    if !o.noheader {
        row(cols.iter().map(|(h, _)| h.to_string()).collect(), true);
        if o.parsable.is_none() {
            row(cols.iter().map(|(_, w)| "-".repeat(*w)).collect(), true);
        }
    }
    for l in selected(lines, o, me) {
        let indent = if o.parsable.is_some() { String::new() } else { " ".repeat(l.depth as usize) };
        let root = l.depth == 0;
        let mut cells = vec![
            format!("{indent}{}", l.account),
            l.user.clone().unwrap_or_default(),
            if root { String::new() } else { l.raw_shares.to_string() },
            ratio(l.norm_shares_ppm),
            l.usage_gpu_s.to_string(),
        ];
        if o.long {
            let norm = if root_usage == 0 { 0 } else { (l.usage_gpu_s as u128 * 1_000_000 / u128::from(root_usage)) as u64 };
            cells.push(ratio(norm));
        }
        cells.push(ratio(l.effective_usage_ppm));
        cells.push(l.fair_share_ppm.map(ratio).unwrap_or_default());
        if o.long {
            cells.push(match l.level_fs_ppm {
                Some(u64::MAX) => "inf".into(),
                Some(v) => ratio(v),
                None => String::new(),
            });
        }
        row(cells, false);
    }
    out
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    if args.iter().any(|a| a == "-V" || a == "--version") {
        return Ok(super::print_version());
    }
    let o = parse(args)?;
    let cluster = super::connect(PROG)?;
    let lines = super::block_on(PROG, async {
        match super::call(PROG, &cluster, ClientRequest::GetShares).await? {
            Reply::Shares(lines) => Ok(lines),
            other => Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
        }
    })??;
    print!("{}", render(&lines, &o, &super::current_user()));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(account: &str, user: Option<&str>, depth: u32, usage: u64, fs: Option<u64>) -> ShareLine {
        ShareLine {
            account: account.into(),
            user: user.map(str::to_string),
            depth,
            raw_shares: 1,
            norm_shares_ppm: 500_000,
            usage_gpu_s: usage,
            effective_usage_ppm: 250_000,
            level_fs_ppm: (depth > 0).then_some(2_000_000),
            fair_share_ppm: fs,
        }
    }

    #[test]
    fn prints_slurms_columns_the_callers_lines_and_all_with_a() {
        let lines = vec![
            line("root", None, 0, 100, None),
            line("physics", None, 1, 100, None),
            line("physics", Some("alice"), 2, 75, Some(500_000)),
            line("physics", Some("bob"), 2, 25, Some(1_000_000)),
        ];
        let me = render(&lines, &parse(&[]).expect("parse"), "bob");
        let want = "             Account       User  RawShares  NormShares    RawUsage  EffectvUsage  FairShare \n\
                    -------------------- ---------- ---------- ----------- ----------- ------------- ---------- \n\
                    root                                          0.500000         100      0.250000            \n \
                    physics                                 1    0.500000         100      0.250000            \n  \
                    physics                   bob          1    0.500000          25      0.250000   1.000000 \n";
        assert_eq!(me, want);
        let all = render(&lines, &parse(&["-a".into(), "-P".into(), "-n".into()]).expect("parse"), "bob");
        assert_eq!(
            all.lines().collect::<Vec<_>>(),
            [
                "root|||0.500000|100|0.250000|",
                "physics||1|0.500000|100|0.250000|",
                "physics|alice|1|0.500000|75|0.250000|0.500000",
                "physics|bob|1|0.500000|25|0.250000|1.000000"
            ]
        );
        let long = render(&lines, &parse(&["-l".into(), "-u".into(), "alice".into(), "-p".into(), "-n".into()]).expect("parse"), "bob");
        assert_eq!(long.lines().nth(2), Some("physics|alice|1|0.500000|75|0.750000|0.250000|0.500000|2.000000|"));
        assert!(parse(&["--format=x".into()]).is_err());
    }
}
