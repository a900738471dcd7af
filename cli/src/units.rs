//! Slurm's formats for time limits and memory sizes.

/// Parses a Slurm time limit (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) into milliseconds.
/// `corral submit` wants a real limit: zero and "unlimited" are refused.
pub fn parse_time_limit_ms(text: &str) -> Result<u64, String> {
    let bad = || format!("invalid time limit '{text}': expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S");
    match crate::slurm::time::parse_limit_s(text) {
        Ok(Some(seconds)) => seconds.checked_mul(1000).ok_or_else(bad),
        Ok(None) => Err(format!("invalid time limit '{text}': must be positive")),
        Err(crate::slurm::time::NotATime) => Err(bad()),
    }
}

/// Parses a memory size (`4096`, `512M`, `4G`, `1T`; a bare number is MiB) into MiB.
pub fn parse_mem_mib(text: &str) -> Result<u64, String> {
    let bad = || format!("invalid memory size '{text}': expected a number with an optional K, M, G or T suffix");
    let t = text.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => (&t[..i], t[i..].to_ascii_uppercase()),
        None => (t, String::new()),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let mib = match unit.trim_end_matches('B') {
        "" | "M" => Some(n),
        "K" => Some(n.div_ceil(1024)),
        "G" => n.checked_mul(1024),
        "T" => n.checked_mul(1024 * 1024),
        _ => None,
    };
    mib.ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slurm_time_format() {
        assert_eq!(parse_time_limit_ms("10"), Ok(600_000));
        assert_eq!(parse_time_limit_ms("10:30"), Ok(630_000));
        assert_eq!(parse_time_limit_ms("1:02:03"), Ok(3_723_000));
        assert_eq!(parse_time_limit_ms("2-3"), Ok((2 * 86_400 + 3 * 3600) * 1000));
        assert_eq!(parse_time_limit_ms("2-3:04"), Ok((2 * 86_400 + 3 * 3600 + 240) * 1000));
        assert_eq!(parse_time_limit_ms("2-3:04:05"), Ok((2 * 86_400 + 3 * 3600 + 245) * 1000));
        for bad in ["", "x", "1:2:3:4", "-1", "1-", "1-2:3:4:5", "0", "1:-2"] {
            assert!(parse_time_limit_ms(bad).is_err(), "{bad} should be refused");
        }
        assert_eq!(parse_time_limit_ms("abc"), Err("invalid time limit 'abc': expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S".to_string()));
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_mem_mib("4096"), Ok(4096));
        assert_eq!(parse_mem_mib("512M"), Ok(512));
        assert_eq!(parse_mem_mib("4G"), Ok(4096));
        assert_eq!(parse_mem_mib("4gb"), Ok(4096));
        assert_eq!(parse_mem_mib("1T"), Ok(1024 * 1024));
        assert_eq!(parse_mem_mib("2048K"), Ok(2));
        assert!(parse_mem_mib("4X").is_err());
        assert!(parse_mem_mib("G").is_err());
    }
}
