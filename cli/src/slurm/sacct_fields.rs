//! `sacct`'s fields as Slurm 22.05 has them (`src/sacct/sacct.c`'s table: names, default widths,
//! how each prints), `--format` as its `options.c` reads it (any case, any unambiguous start of a
//! name, the first in the table winning; `ALL`; `%N` widths) and `--helpformat`'s listing. Pure.

use super::SlurmError;

/// How a field prints in columns, as the `print_fields_*` routine of its table entry does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Print {
    /// `print_fields_str`: a value longer than the width is cut, its last character `+`.
    Str,
    /// `print_fields_uint`, `_uint64`: printed whole whatever the width.
    Uint,
    /// `print_fields_date`: cut to the width, without a `+`.
    Date,
    /// `print_fields_time_from_secs` (`secs2time_str`): printed whole whatever the width.
    Secs,
}

/// Slurm 22.05's fields in its order: name, default width (negative: left-justified) and how it
/// prints. Corral's own fields follow them (see [`CORRAL_FIELDS`]).
pub const FIELDS: &[(&str, i32, Print)] = &[
    ("Account", 10, Print::Str),
    ("AdminComment", 15, Print::Str),
    ("AllocCPUS", 10, Print::Uint),
    ("AllocNodes", 10, Print::Str),
    ("AllocTRES", 10, Print::Str),
    ("AssocID", 7, Print::Uint),
    ("AveCPU", 10, Print::Str),
    ("AveCPUFreq", 10, Print::Str),
    ("AveDiskRead", 14, Print::Str),
    ("AveDiskWrite", 14, Print::Str),
    ("AvePages", 10, Print::Str),
    ("AveRSS", 10, Print::Str),
    ("AveVMSize", 10, Print::Str),
    ("BlockID", 16, Print::Str),
    ("Cluster", 10, Print::Str),
    ("Comment", 14, Print::Str),
    ("Constraints", 19, Print::Str),
    ("ConsumedEnergy", 14, Print::Str),
    ("ConsumedEnergyRaw", 17, Print::Uint),
    ("Container", 19, Print::Str),
    ("CPUTime", 10, Print::Secs),
    ("CPUTimeRAW", 10, Print::Uint),
    ("DBIndex", -10, Print::Uint),
    ("DerivedExitCode", 15, Print::Str),
    ("Elapsed", 10, Print::Secs),
    ("ElapsedRaw", 10, Print::Uint),
    ("Eligible", 19, Print::Date),
    ("End", 19, Print::Date),
    ("ExitCode", 8, Print::Str),
    ("Flags", 19, Print::Str),
    ("GID", 6, Print::Uint),
    ("Group", 9, Print::Str),
    ("JobID", -12, Print::Str),
    ("JobIDRaw", -12, Print::Str),
    ("JobName", 10, Print::Str),
    ("Layout", 9, Print::Str),
    ("MaxDiskRead", 12, Print::Str),
    ("MaxDiskReadNode", 15, Print::Str),
    ("MaxDiskReadTask", 15, Print::Uint),
    ("MaxDiskWrite", 12, Print::Str),
    ("MaxDiskWriteNode", 16, Print::Str),
    ("MaxDiskWriteTask", 16, Print::Uint),
    ("MaxPages", 8, Print::Str),
    ("MaxPagesNode", 12, Print::Str),
    ("MaxPagesTask", 14, Print::Uint),
    ("MaxRSS", 10, Print::Str),
    ("MaxRSSNode", 10, Print::Str),
    ("MaxRSSTask", 10, Print::Uint),
    ("MaxVMSize", 10, Print::Str),
    ("MaxVMSizeNode", 14, Print::Str),
    ("MaxVMSizeTask", 14, Print::Uint),
    ("McsLabel", 12, Print::Str),
    ("MinCPU", 10, Print::Str),
    ("MinCPUNode", 10, Print::Str),
    ("MinCPUTask", 10, Print::Uint),
    ("NCPUS", 10, Print::Uint),
    ("NNodes", 8, Print::Uint),
    ("NodeList", 15, Print::Str),
    ("NTasks", 8, Print::Uint),
    ("Partition", 10, Print::Str),
    ("Priority", 10, Print::Uint),
    ("QOS", 10, Print::Str),
    ("QOSRAW", 6, Print::Uint),
    ("Reason", 22, Print::Str),
    ("ReqCPUFreq", 10, Print::Str),
    ("ReqCPUFreqGov", 13, Print::Str),
    ("ReqCPUFreqMax", 13, Print::Str),
    ("ReqCPUFreqMin", 13, Print::Str),
    ("ReqCPUS", 8, Print::Uint),
    ("ReqMem", 10, Print::Str),
    ("ReqNodes", 8, Print::Str),
    ("ReqTRES", 10, Print::Str),
    ("Reservation", 20, Print::Str),
    ("ReservationId", 8, Print::Uint),
    ("Reserved", 10, Print::Secs),
    ("ResvCPU", 10, Print::Secs),
    ("ResvCPURAW", 10, Print::Uint),
    ("Start", 19, Print::Date),
    ("State", 10, Print::Str),
    ("Submit", 19, Print::Date),
    ("SubmitLine", 20, Print::Str),
    ("Suspended", 10, Print::Secs),
    ("SystemComment", 15, Print::Str),
    ("SystemCPU", 10, Print::Str),
    ("Timelimit", 10, Print::Str),
    ("TimelimitRaw", 10, Print::Str),
    ("TotalCPU", 10, Print::Str),
    ("TRESUsageInAve", 14, Print::Str),
    ("TRESUsageInMax", 14, Print::Str),
    ("TRESUsageInMaxNode", 18, Print::Str),
    ("TRESUsageInMaxTask", 18, Print::Str),
    ("TRESUsageInMin", 14, Print::Str),
    ("TRESUsageInMinNode", 18, Print::Str),
    ("TRESUsageInMinTask", 18, Print::Str),
    ("TRESUsageInTot", 14, Print::Str),
    ("TRESUsageOutAve", 15, Print::Str),
    ("TRESUsageOutMax", 15, Print::Str),
    ("TRESUsageOutMaxNode", 19, Print::Str),
    ("TRESUsageOutMaxTask", 19, Print::Str),
    ("TRESUsageOutMin", 15, Print::Str),
    ("TRESUsageOutMinNode", 19, Print::Str),
    ("TRESUsageOutMinTask", 19, Print::Str),
    ("TRESUsageOutTot", 15, Print::Str),
    ("UID", 6, Print::Uint),
    ("User", 9, Print::Str),
    ("UserCPU", 10, Print::Str),
    ("WCKey", 10, Print::Str),
    ("WCKeyID", 10, Print::Uint),
    ("WorkDir", 20, Print::Str),
];

/// Fields Corral adds after Slurm 22.05's: `ArrayJobID` and `ArrayTaskID` (an array task's
/// parts of `JobID`), `GPUSeconds` (GPU-seconds used, a MIG instance by its share of the GPU) and
/// `Restarts` (the job's requeues, a field of later Slurm releases). Slurm 22.05 refuses them.
pub const CORRAL_FIELDS: &[(&str, i32, Print)] =
    &[("ArrayJobID", 15, Print::Str), ("ArrayTaskID", 11, Print::Str), ("GPUSeconds", 10, Print::Uint), ("Restarts", 8, Print::Uint)];

fn all_fields() -> impl Iterator<Item = &'static (&'static str, i32, Print)> {
    FIELDS.iter().chain(CORRAL_FIELDS)
}

/// A requested column: its canonical name and width (negative: left-justified).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub width: i32,
}

impl Column {
    /// How the column's values print.
    pub fn print(&self) -> Print {
        print_of(self.name)
    }
}

/// How field `name` (canonical) prints; a name not in the table prints as a string.
pub fn print_of(name: &str) -> Print {
    all_fields().find(|(n, _, _)| *n == name).map_or(Print::Str, |(_, _, p)| *p)
}

/// C's `atoi`: leading blanks, a sign, then digits; 0 when there are none.
fn atoi(text: &str) -> i32 {
    let t = text.trim_start();
    let (sign, digits) = match t.as_bytes().first() {
        Some(b'-') => (-1i64, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let n = digits.bytes().take_while(u8::is_ascii_digit).fold(0i64, |n, d| (n * 10 + i64::from(d - b'0')).min(i64::from(i32::MAX) + 1));
    i32::try_from(sign * n).unwrap_or(if sign < 0 { i32::MIN } else { i32::MAX })
}

/// Parses `--format=JobID,JobName%30,...` as sacct 22.05 does: a name is matched, in any case,
/// against the start of each field's in table order (`jobn` is `JobName`, `Elapsed` is not
/// `ElapsedRaw`); `ALL` is every field; `%N` sets the width to N (`atoi`: a positive N right-
/// justifies even a left-justified field, `%-N` left-justifies). Slurm's messages otherwise.
pub fn parse_fields(text: &str) -> Result<Vec<Column>, SlurmError> {
    let mut out = Vec::new();
    for item in text.split(',') {
        let item = item.trim_start();
        if item.is_empty() {
            continue;
        }
        let (name, width) = match item.split_once('%') {
            Some((n, w)) => (n, Some(atoi(w))),
            None => (item, None),
        };
        let starts = |field: &str| field.len() >= name.len() && field[..name.len()].eq_ignore_ascii_case(name);
        if starts("ALL") {
            out.extend(FIELDS.iter().map(|(n, w, _)| Column { name: n, width: width.unwrap_or(*w) }));
            continue;
        }
        let Some((canon, default, _)) = all_fields().find(|(f, _, _)| starts(f)) else {
            for (gone, now) in [("AllocGRES", "AllocTRES"), ("ReqGRES", "ReqTRES")] {
                if gone.eq_ignore_ascii_case(name) {
                    return Err(SlurmError { text: format!("sacct: fatal: {gone} has been removed, please use {now}"), code: 1 });
                }
            }
            return Err(SlurmError::fatal("sacct", format!("Invalid field requested: \"{name}\"")));
        };
        out.push(Column { name: canon, width: width.unwrap_or(*default) });
    }
    Ok(out)
}

/// `--helpformat`: the names four to a line, each padded to 19 and one space between, as
/// `_help_fields_msg` prints them (the last of a line keeps its padding).
pub fn helpformat() -> String {
    let mut out = String::new();
    for (i, (name, _, _)) in all_fields().enumerate() {
        if i % 4 != 0 {
            out.push(' ');
        } else if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!("{name:<19}"));
    }
    out.push('\n');
    out
}

/// `value` in a column of `width` characters as `print` prints it: a string cut to the width
/// with its last character `+`, a date cut without one, a number or a duration whole; right-
/// justified, or left-justified for a negative width.
pub fn cell(value: &str, width: i32, print: Print) -> String {
    let w = width.unsigned_abs() as usize;
    let v: String = match print {
        Print::Str if value.chars().count() > w => value.chars().take(w.saturating_sub(1)).chain(std::iter::once('+')).take(w).collect(),
        Print::Date => value.chars().take(w).collect(),
        _ => value.to_string(),
    };
    if width < 0 {
        format!("{v:<w$}")
    } else {
        format!("{v:>w$}")
    }
}

/// A column's header as `print_fields_header` prints it: the name cut to the width, no `+`.
pub fn header(column: &Column) -> String {
    cell(column.name, column.width, Print::Date)
}
