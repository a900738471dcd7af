//! Slurm's time formats: time limits (`D-H:M:S`), durations as squeue, sinfo, sacct and scontrol
//! print them, dates (`2024-05-01T14:05:00`, or as `SLURM_TIME_FORMAT` asks), and the points in
//! time `--begin`, `sacct -S/-E` accept.

/// Text that is not a Slurm time limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotATime;

/// A Slurm time limit (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) in seconds.
/// `Ok(None)` is no limit (`0`, `UNLIMITED`, `INFINITE`, `-1`); `Err` is not a time.
pub fn parse_limit_s(text: &str) -> Result<Option<u64>, NotATime> {
    let t = text.trim();
    if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinite") || t == "-1" {
        return Ok(None);
    }
    let num = |s: &str| -> Result<u64, NotATime> {
        if s.is_empty() || s.len() > 12 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(NotATime);
        }
        s.parse::<u64>().map_err(|_| NotATime)
    };
    let (days, rest) = match t.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, t),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let seconds = match (days, parts.as_slice()) {
        (None, [m]) => num(m)? * 60,
        (None, [m, s]) => num(m)? * 60 + num(s)?,
        (None, [h, m, s]) => num(h)? * 3600 + num(m)? * 60 + num(s)?,
        (Some(d), [h]) => d * 86_400 + num(h)? * 3600,
        (Some(d), [h, m]) => d * 86_400 + num(h)? * 3600 + num(m)? * 60,
        (Some(d), [h, m, s]) => d * 86_400 + num(h)? * 3600 + num(m)? * 60 + num(s)?,
        _ => return Err(NotATime),
    };
    Ok(if seconds == 0 { None } else { Some(seconds) })
}

/// A duration as sinfo prints TIMELIMIT (its `_print_secs`): `0:05`, `12:34`, `1:02:03`,
/// `2-03:04:05`.
pub fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// Slurm's `YEAR_SECONDS`.
const YEAR_S: i64 = 365 * 24 * 3600;

/// A duration as squeue prints TIME, TIME_LIMIT and TIME_LEFT (its `_print_secs`): sinfo's
/// form, and `INVALID` below 0 or beyond a year.
pub fn squeue_duration(secs: i64) -> String {
    match u64::try_from(secs) {
        Ok(s) if secs <= YEAR_S => duration(s),
        _ => "INVALID".into(),
    }
}

/// A duration as Slurm's `secs2time_str` prints it (sacct's Elapsed and Timelimit, scontrol's
/// RunTime, TimeLimit, MaxTime): `00:00:05`, `08:00:00`, `2-03:04:05`.
pub fn elapsed(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// [`elapsed`] of a difference that may be negative: `secs2time_str` prints `INVALID` then.
pub fn elapsed_signed(secs: i64) -> String {
    u64::try_from(secs).map_or_else(|_| "INVALID".into(), elapsed)
}

/// Broken-down local time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    pub year: i32,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
}

pub fn to_local(epoch_s: i64) -> Local {
    // SAFETY: localtime_r writes only into the tm we pass.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        let t: libc::time_t = epoch_s as libc::time_t;
        libc::localtime_r(&t, &mut tm);
        tm
    };
    Local {
        year: tm.tm_year + 1900,
        month: (tm.tm_mon + 1) as u32,
        day: tm.tm_mday as u32,
        hour: tm.tm_hour as u32,
        minute: tm.tm_min as u32,
        second: tm.tm_sec as u32,
    }
}

/// Local calendar time to seconds since the epoch (mktime normalizes out-of-range fields,
/// so day 32 is the 1st of the next month).
pub fn from_local(l: Local) -> i64 {
    // SAFETY: mktime reads and normalizes the tm we own.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        tm.tm_year = l.year - 1900;
        tm.tm_mon = l.month as i32 - 1;
        tm.tm_mday = l.day as i32;
        tm.tm_hour = l.hour as i32;
        tm.tm_min = l.minute as i32;
        tm.tm_sec = l.second as i32;
        tm.tm_isdst = -1;
        libc::mktime(&mut tm) as i64
    }
}

/// How dates print, as Slurm's `slurm_make_time_str` reads `SLURM_TIME_FORMAT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DateFormat {
    /// Unset, empty or `standard`: `2026-11-30T00:20:06`.
    Standard,
    /// `relative`: by its distance from today (`12:26:38`, `Ystday 20:13`, `Tomorr 03:22`,
    /// `Sat 02:17`, `18 Jun 13:14`, `19 Jan 2003`).
    Relative,
    /// A strftime(3) format.
    Custom(String),
}

impl DateFormat {
    /// `SLURM_TIME_FORMAT`'s value read as Slurm reads it; `Err` is the value Slurm refuses (no
    /// `%`, or 32 bytes or more: it says so and prints the standard form).
    pub fn from_value(value: Option<&str>) -> Result<DateFormat, String> {
        match value {
            None | Some("") | Some("standard") => Ok(DateFormat::Standard),
            Some("relative") => Ok(DateFormat::Relative),
            Some(f) if !f.contains('%') || f.len() >= 32 => Err(f.to_string()),
            Some(f) => Ok(DateFormat::Custom(f.to_string())),
        }
    }
}

/// The process's `SLURM_TIME_FORMAT`, read once (a refused one said once on stderr, in
/// Slurm's words).
fn date_format() -> &'static DateFormat {
    static FORMAT: std::sync::OnceLock<DateFormat> = std::sync::OnceLock::new();
    FORMAT.get_or_init(|| {
        DateFormat::from_value(std::env::var("SLURM_TIME_FORMAT").ok().as_deref()).unwrap_or_else(|bad| {
            let prog = std::env::args().next().map(|a| a.rsplit('/').next().unwrap_or("").to_string()).unwrap_or_default();
            eprintln!("{prog}: error: invalid SLURM_TIME_FORMAT = '{bad}'");
            DateFormat::Standard
        })
    })
}

fn local_tm(epoch_s: i64) -> libc::tm {
    // SAFETY: localtime_r writes only into the tm we pass.
    unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        let t: libc::time_t = epoch_s as libc::time_t;
        libc::localtime_r(&t, &mut tm);
        tm
    }
}

/// `strftime` into Slurm's 32-byte buffer: at most 31 bytes; `#`s when it makes nothing, as
/// `slurm_strftime` does.
fn strftime(format: &str, tm: &libc::tm) -> String {
    const SIZE: usize = 32;
    let Ok(c_format) = std::ffi::CString::new(format) else { return "#".repeat(SIZE - 1) };
    let mut buf = [0u8; 256];
    // SAFETY: strftime writes at most buf.len() bytes into buf and reads the NUL-terminated
    // format and the tm we own.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), c_format.as_ptr(), tm) };
    if n == 0 {
        return "#".repeat(SIZE - 1);
    }
    let text = String::from_utf8_lossy(&buf[..n.min(SIZE - 1)]);
    text.into_owned()
}

/// `_relative_date_fmt`: the strftime format of a date `when` by its distance in days from
/// `today` (both local).
fn relative_format(when: &libc::tm, today: &libc::tm) -> &'static str {
    let day = |tm: &libc::tm| 1000 * (i64::from(tm.tm_year) + 1900) + i64::from(tm.tm_yday);
    match day(when) - day(today) {
        -1 => "Ystday %H:%M",
        0 => "%H:%M:%S",
        1 => "Tomorr %H:%M",
        d if !(-365..=365).contains(&d) => "%-d %b %Y",
        d if !(-1..=6).contains(&d) => "%-d %b %H:%M",
        _ => "%a %H:%M",
    }
}

/// Milliseconds since the Unix epoch now (0 before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A date as Slurm prints it (`slurm_make_time_str`), in local time and `SLURM_TIME_FORMAT`'s
/// form: `2026-11-30T00:20:06` by default.
pub fn datetime(epoch_ms: u64) -> String {
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    datetime_as(epoch_ms, date_format(), now_s)
}

/// [`datetime`] in `format`, `now_s` being today for the relative form.
pub fn datetime_as(epoch_ms: u64, format: &DateFormat, now_s: i64) -> String {
    let epoch_s = (epoch_ms / 1000) as i64;
    match format {
        DateFormat::Standard => {
            let l = to_local(epoch_s);
            format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", l.year, l.month, l.day, l.hour, l.minute, l.second)
        }
        DateFormat::Relative => {
            let when = local_tm(epoch_s);
            strftime(relative_format(&when, &local_tm(now_s)), &when)
        }
        DateFormat::Custom(f) => strftime(f, &local_tm(epoch_s)),
    }
}

/// Parses a point in time the way Slurm's `parse_time` does, relative to `now_s`:
/// `now[+-N[seconds|minutes|hours|days|weeks]]`, `today`, `tomorrow`, `midnight`, `noon`,
/// `elevenses`, `fika`, `teatime`, `HH:MM[:SS]` (today, or tomorrow once past),
/// `YYYY-MM-DD[THH:MM[:SS]]`, `MM/DD[/YY]` and `MMDD[YY]`. Seconds since the epoch.
pub fn parse_point(text: &str, now_s: i64) -> Option<i64> {
    let t = text.trim().to_ascii_lowercase();
    let now = to_local(now_s);
    let at =
        |day_offset: u32, hour: u32, minute: u32, second: u32| from_local(Local { day: now.day + day_offset, hour, minute, second, ..now });
    if let Some(rest) = t.strip_prefix("now") {
        if rest.is_empty() {
            return Some(now_s);
        }
        let (sign, rest) = match rest.as_bytes()[0] {
            b'+' => (1i64, &rest[1..]),
            b'-' => (-1i64, &rest[1..]),
            _ => return None,
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: i64 = rest[..digits].parse().ok()?;
        let unit = &rest[digits..];
        let scale = match unit {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            _ => return None,
        };
        return Some(now_s + sign * n.checked_mul(scale)?);
    }
    let named = match t.as_str() {
        "today" => Some(at(0, 0, 0, 0)),
        "tomorrow" => Some(at(1, 0, 0, 0)),
        "midnight" => Some(at(1, 0, 0, 0)),
        _ => None,
    };
    if named.is_some() {
        return named;
    }
    let hour_named = match t.as_str() {
        "noon" => Some(12),
        "elevenses" => Some(11),
        "fika" => Some(15),
        "teatime" => Some(16),
        _ => None,
    };
    if let Some(h) = hour_named {
        let today = at(0, h, 0, 0);
        return Some(if today <= now_s { at(1, h, 0, 0) } else { today });
    }
    let num = |s: &str| -> Option<u32> { (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok()).flatten() };
    let clock = |s: &str| -> Option<(u32, u32, u32)> {
        let p: Vec<&str> = s.split(':').collect();
        let (h, m, sec) = match p.as_slice() {
            [h, m] => (num(h)?, num(m)?, 0),
            [h, m, s] => (num(h)?, num(m)?, num(s)?),
            _ => return None,
        };
        (h < 24 && m < 60 && sec < 61).then_some((h, m, sec))
    };
    // Dates, optionally with THH:MM[:SS].
    let (date, time) = match t.split_once('t') {
        Some((d, tm)) => (d, Some(clock(tm)?)),
        None => (t.as_str(), None),
    };
    if date.contains(':') && time.is_none() {
        let (h, m, s) = clock(date)?;
        let today = at(0, h, m, s);
        return Some(if today <= now_s { at(1, h, m, s) } else { today });
    }
    let (year, month, day) = if let [y, m, d] = date.split('-').collect::<Vec<_>>().as_slice() {
        (num(y)? as i32, num(m)?, num(d)?)
    } else if date.contains('/') || date.contains('.') {
        let p: Vec<&str> = date.split(['/', '.']).collect();
        match p.as_slice() {
            [m, d] => (now.year, num(m)?, num(d)?),
            [m, d, y] => (2000 + num(y)? as i32 % 100, num(m)?, num(d)?),
            _ => return None,
        }
    } else if date.len() == 4 || date.len() == 6 {
        num(date)?;
        let m = num(&date[0..2])?;
        let d = num(&date[2..4])?;
        let y = if date.len() == 6 { 2000 + num(&date[4..6])? as i32 } else { now.year };
        (y, m, d)
    } else {
        return None;
    };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (hour, minute, second) = time.unwrap_or((0, 0, 0));
    Some(from_local(Local { year, month, day, hour, minute, second }))
}
