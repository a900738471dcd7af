//! `sprio`: the factors of each pending job's priority, as Slurm 22.05 prints them (its
//! default and `-l` formats, `-n` normalized, `-w` weights). Corral has no site factor and no
//! TRES weights: `SITE` is 0 and there is no `TRES` column, as in a Slurm that sets neither.

use proto::accounts::PriorityLine;
use proto::{ClientRequest, Reply};

use super::opts::{self, opt, Arg, OptDef};
use super::SlurmError;

const PROG: &str = "sprio";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub jobs: Vec<proto::JobId>,
    pub users: Vec<String>,
    pub noheader: bool,
    pub long: bool,
    pub norm: bool,
    pub weights: bool,
}

const OPTIONS: &[OptDef] = &[
    opt("jobs", Some('j'), Arg::Required),
    opt("long", Some('l'), Arg::No),
    opt("noheader", Some('h'), Arg::No),
    opt("norm", Some('n'), Arg::No),
    opt("user", Some('u'), Arg::Required),
    opt("users", None, Arg::Required),
    opt("weights", Some('w'), Arg::No),
];

pub fn parse(args: &[String]) -> Result<Options, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, false)?;
    if let Some(extra) = p.operands.first() {
        return Err(SlurmError::fatal(PROG, format!("Unknown argument: {extra} (Corral's sprio takes -h, -j, -l, -n, -u, -w)")));
    }
    let split = |name: &str| p.all(name).into_iter().flat_map(|v| v.split(',')).filter(|s| !s.is_empty()).collect::<Vec<_>>();
    let mut jobs = Vec::new();
    for id in split("jobs") {
        jobs.push(id.parse().map_err(|_| SlurmError::fatal(PROG, format!("Invalid job id: {id}")))?);
    }
    let users = split("user").into_iter().chain(split("users")).map(str::to_string).collect();
    Ok(Options { jobs, users, noheader: p.has("noheader"), long: p.has("long"), norm: p.has("norm"), weights: p.has("weights") })
}

/// The columns after JOBID and PARTITION (and USER with `-l`): header, width.
const FACTORS: [&str; 5] = ["AGE", "FAIRSHARE", "JOBSIZE", "PARTITION", "QOS"];

fn push(out: &mut String, cell: &str, width: usize, left: bool) {
    if left {
        out.push_str(&format!("{cell:<width$.width$} "));
    } else {
        out.push_str(&format!("{cell:>width$.width$} "));
    }
}

/// The row's cells after the job, partition and user.
fn factor_cells(weights: &[u32; 5], l: &PriorityLine, norm: bool) -> Vec<String> {
    let mut cells = Vec::new();
    if norm {
        cells.push(format!("{:.7}", l.priority as f64 / f64::from(u32::MAX)));
        cells.push(format!("{:.7}", 0.0));
        cells.extend(l.factors_ppm.iter().map(|f| format!("{:.7}", *f as f64 / 1e6)));
    } else {
        cells.push(l.priority.to_string());
        cells.push("0".into());
        for (w, f) in weights.iter().zip(l.factors_ppm) {
            cells.push(format!("{}", (f64::from(*w) * f as f64 / 1e6).round() as u64));
        }
    }
    cells
}

pub fn render(weights: &[u32; 5], lines: &[PriorityLine], o: &Options) -> String {
    let mut out = String::new();
    let header = |out: &mut String| {
        push(out, "JOBID", 15, false);
        push(out, "PARTITION", 9, true);
        if o.long {
            push(out, "USER", 8, false);
        }
        for h in ["PRIORITY", "SITE"].iter().chain(&FACTORS) {
            push(out, h, 10, false);
        }
        if o.long {
            push(out, "NICE", 11, false);
        }
        out.pop();
        out.push('\n');
    };
    if !o.noheader {
        header(&mut out);
    }
    if o.weights {
        push(&mut out, "Weights", 15, false);
        push(&mut out, "", 9, true);
        if o.long {
            push(&mut out, "", 8, false);
        }
        push(&mut out, "", 10, false);
        push(&mut out, "", 10, false);
        for w in weights {
            push(&mut out, &w.to_string(), 10, false);
        }
        out.pop();
        out.push('\n');
    }
    for l in lines {
        push(&mut out, &l.job.to_string(), 15, false);
        push(&mut out, &l.partition, 9, true);
        if o.long {
            push(&mut out, &l.user, 8, false);
        }
        for c in factor_cells(weights, l, o.norm) {
            push(&mut out, &c, 10, false);
        }
        if o.long {
            push(&mut out, &l.nice.to_string(), 11, false);
        }
        out.pop();
        out.push('\n');
    }
    out
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    if args.iter().any(|a| a == "-V" || a == "--version") {
        return Ok(super::print_version());
    }
    let o = parse(args)?;
    let cluster = super::connect(PROG)?;
    let request = ClientRequest::GetPriorities { jobs: o.jobs.clone(), users: o.users.clone() };
    let (weights, lines) = super::block_on(PROG, async {
        match super::call(PROG, &cluster, request).await? {
            Reply::Priorities { weights, jobs } => Ok((weights, jobs)),
            other => Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
        }
    })??;
    if lines.is_empty() && (!o.jobs.is_empty() || !o.users.is_empty()) {
        // As Slurm: nothing pending matched what was asked for.
        println!("Unable to find jobs matching user/id(s) specified");
        return Ok(0);
    }
    print!("{}", render(&weights, &lines, &o));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_weighted_and_normalized_factors_in_slurms_columns() {
        let weights = [1000, 10_000, 1000, 10_000, 10_000];
        let lines = vec![PriorityLine {
            job: 42,
            user: "alice".into(),
            partition: "gpu".into(),
            priority: 10_503,
            factors_ppm: [2_500, 1_000_000, 250_000, 0, 0],
            nice: 0,
        }];
        let o = parse(&[]).expect("parse");
        assert_eq!(
            render(&weights, &lines, &o),
            "          JOBID PARTITION   PRIORITY       SITE        AGE  FAIRSHARE    JOBSIZE  PARTITION        QOS\n\
             \x20            42 gpu            10503          0          3      10000        250          0          0\n"
        );
        let o = parse(&["-l".into(), "-n".into(), "-h".into(), "-w".into()]).expect("parse");
        let out = render(&weights, &lines, &o);
        let rows: Vec<&str> = out.lines().collect();
        assert_eq!(rows[0].split_whitespace().collect::<Vec<_>>(), ["Weights", "1000", "10000", "1000", "10000", "10000"]);
        assert_eq!(
            rows[1].split_whitespace().collect::<Vec<_>>(),
            ["42", "gpu", "alice", "0.0000024", "0.0000000", "0.0025000", "1.0000000", "0.2500000", "0.0000000", "0.0000000", "0"]
        );
        assert_eq!(parse(&["-j1,2".into(), "--user=bob".into()]).expect("parse").jobs, vec![1, 2]);
        assert!(parse(&["-o".into(), "%i".into()]).is_err());
    }
}
