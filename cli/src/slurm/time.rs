//! Slurm's time formats: time limits (`D-H:M:S`), durations as squeue and sacct print them,
//! and the points in time `--begin`, `sacct -S/-E` accept.

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

/// A duration as squeue prints TIME and TIME_LIMIT: `0:05`, `12:34`, `1:02:03`, `2-03:04:05`.
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

/// A duration as sacct prints Elapsed and Timelimit: `00:00:05`, `2-03:04:05`.
pub fn elapsed(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
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

/// `2026-11-30T00:20:06` in local time, as Slurm prints times.
pub fn datetime(epoch_ms: u64) -> String {
    let l = to_local((epoch_ms / 1000) as i64);
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", l.year, l.month, l.day, l.hour, l.minute, l.second)
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
