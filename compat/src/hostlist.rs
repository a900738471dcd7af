//! Slurm's compressed host lists (`gpu[01-04,07]`, `n[1-3],login`) in both directions.
//!
//! Self-contained on purpose (std only, no `crate::` paths): the node crate's launcher includes
//! this module too.

/// Most hosts one list may expand to; a guard against `n[0-999999999]`.
pub const HOSTS_MAX: usize = 1 << 20;

/// Expands a host list into host names, in order: `gpu[01-02,07],login` gives
/// `gpu01 gpu02 gpu07 login`. Several bracket groups in one name multiply
/// (`r[1-2]n[1-2]` gives `r1n1 r1n2 r2n1 r2n2`). Empty entries are skipped.
pub fn expand(text: &str) -> Result<Vec<String>, String> {
    let mut hosts = Vec::new();
    for item in split_top_level(text)? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let mut partial = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    if rest.contains(']') {
                        return Err(format!("invalid hostlist '{text}': unbalanced ']'"));
                    }
                    partial.iter_mut().for_each(|p| p.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let literal = &rest[..open];
                    if literal.contains(']') {
                        return Err(format!("invalid hostlist '{text}': unbalanced ']'"));
                    }
                    let close =
                        rest[open..].find(']').map(|c| c + open).ok_or_else(|| format!("invalid hostlist '{text}': unbalanced '['"))?;
                    let numbers = expand_ranges(&rest[open + 1..close]).map_err(|e| format!("invalid hostlist '{text}': {e}"))?;
                    if partial.len().saturating_mul(numbers.len()).saturating_add(hosts.len()) > HOSTS_MAX {
                        return Err(format!("invalid hostlist '{text}': more than {HOSTS_MAX} hosts"));
                    }
                    let mut next = Vec::with_capacity(partial.len() * numbers.len());
                    for p in &partial {
                        for n in &numbers {
                            next.push(format!("{p}{literal}{n}"));
                        }
                    }
                    partial = next;
                    rest = &rest[close + 1..];
                }
            }
        }
        hosts.extend(partial);
    }
    Ok(hosts)
}

/// Splits on commas that are not inside brackets.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err(format!("invalid hostlist '{text}': nested '['"));
                }
                depth += 1;
            }
            ']' => {
                depth = depth.checked_sub(1).ok_or_else(|| format!("invalid hostlist '{text}': unbalanced ']'"))?;
            }
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("invalid hostlist '{text}': unbalanced '['"));
    }
    items.push(&text[start..]);
    Ok(items)
}

/// `01-04,07` into `["01", "02", "03", "04", "07"]`, keeping the low bound's zero padding.
fn expand_ranges(ranges: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for range in ranges.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!("bad range '{range}'"));
        }
        let lo_n: u64 = lo.parse().map_err(|_| format!("bad range '{range}'"))?;
        let hi_n: u64 = hi.parse().map_err(|_| format!("bad range '{range}'"))?;
        if hi_n < lo_n {
            return Err(format!("bad range '{range}': end before start"));
        }
        if (hi_n - lo_n) as usize >= HOSTS_MAX || out.len() + ((hi_n - lo_n) as usize) >= HOSTS_MAX {
            return Err(format!("range '{range}' holds more than {HOSTS_MAX} hosts"));
        }
        let width = lo.len();
        out.extend((lo_n..=hi_n).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

/// Compresses host names into Slurm's ranged form: `gpu01 gpu02 gpu03 gpu04 gpu07` gives
/// `gpu[01-04,07]`; `n1 n2 n3 login` gives `n[1-3],login`. Names are grouped by their prefix
/// (everything before the trailing digits) and zero padding, in order of first appearance;
/// numbers are sorted and duplicates dropped within a group.
pub fn compress(hosts: &[String]) -> String {
    struct Group {
        prefix: String,
        /// Zero-padded width, 0 for unpadded numbers; `None` for a name without digits.
        width: Option<usize>,
        numbers: Vec<u64>,
    }
    // Parse each name into (prefix, digits).
    let parsed: Vec<(&str, Option<&str>)> = hosts
        .iter()
        .map(|h| {
            let cut = h.trim_end_matches(|c: char| c.is_ascii_digit()).len();
            let digits = &h[cut..];
            // Numbers that do not fit are kept as plain names.
            if digits.is_empty() || digits.len() > 18 {
                (h.as_str(), None)
            } else {
                (&h[..cut], Some(digits))
            }
        })
        .collect();
    let padded = |d: &str| d.len() > 1 && d.starts_with('0');
    // Widths used by zero-padded names, per prefix: an unpadded number of the same length
    // (`gpu10` next to `gpu09`) joins that group. Indexed, so a list of a million hosts in many
    // groups compresses in linear time.
    let mut padded_widths: std::collections::HashSet<(&str, usize)> = std::collections::HashSet::new();
    for (prefix, digits) in &parsed {
        if let Some(d) = digits {
            if padded(d) {
                padded_widths.insert((prefix, d.len()));
            }
        }
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut index: std::collections::HashMap<(&str, Option<usize>), usize> = std::collections::HashMap::new();
    for (prefix, digits) in parsed {
        let (width, number) = match digits {
            None => (None, 0),
            Some(d) => {
                let width = if padded(d) || padded_widths.contains(&(prefix, d.len())) { d.len() } else { 0 };
                (Some(width), d.parse().unwrap_or(0))
            }
        };
        match index.get(&(prefix, width)) {
            Some(&i) => groups[i].numbers.push(number),
            None => {
                index.insert((prefix, width), groups.len());
                groups.push(Group { prefix: prefix.to_string(), width, numbers: vec![number] });
            }
        }
    }
    let mut out: Vec<String> = Vec::new();
    for mut g in groups {
        let Some(width) = g.width else {
            out.push(g.prefix);
            continue;
        };
        g.numbers.sort_unstable();
        g.numbers.dedup();
        let mut ranges = Vec::new();
        let mut i = 0;
        while i < g.numbers.len() {
            let mut j = i;
            while j + 1 < g.numbers.len() && g.numbers[j + 1] == g.numbers[j] + 1 {
                j += 1;
            }
            if i == j {
                ranges.push(format!("{:0width$}", g.numbers[i]));
            } else {
                ranges.push(format!("{:0width$}-{:0width$}", g.numbers[i], g.numbers[j]));
            }
            i = j + 1;
        }
        if g.numbers.len() == 1 {
            out.push(format!("{}{}", g.prefix, ranges[0]));
        } else {
            out.push(format!("{}[{}]", g.prefix, ranges.join(",")));
        }
    }
    out.join(",")
}

/// Compresses a list of counts the way Slurm writes `SLURM_TASKS_PER_NODE`: `4,4,2` gives
/// `4(x2),2`.
pub fn compress_counts(counts: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let mut j = i;
        while j + 1 < counts.len() && counts[j + 1] == counts[i] {
            j += 1;
        }
        let n = j - i + 1;
        out.push(if n == 1 { counts[i].to_string() } else { format!("{}(x{n})", counts[i]) });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn expands_ranges_lists_and_padding() {
        assert_eq!(expand("gpu[01-04,07]").unwrap(), names(&["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]));
        assert_eq!(expand("n[1-3],login").unwrap(), names(&["n1", "n2", "n3", "login"]));
        assert_eq!(expand("vm").unwrap(), names(&["vm"]));
        assert_eq!(expand("n[8-10]").unwrap(), names(&["n8", "n9", "n10"]));
        assert_eq!(expand("n[008-010]").unwrap(), names(&["n008", "n009", "n010"]));
        assert_eq!(expand("r[1-2]n[1-2]").unwrap(), names(&["r1n1", "r1n2", "r2n1", "r2n2"]));
        assert_eq!(expand("gpu[1-2]-ib").unwrap(), names(&["gpu1-ib", "gpu2-ib"]));
        assert_eq!(expand("a,,b").unwrap(), names(&["a", "b"]));
        assert_eq!(expand("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn refuses_malformed_lists() {
        assert_eq!(expand("gpu[01-04"), Err("invalid hostlist 'gpu[01-04': unbalanced '['".to_string()));
        assert_eq!(expand("gpu01]"), Err("invalid hostlist 'gpu01]': unbalanced ']'".to_string()));
        assert_eq!(expand("n[5-3]"), Err("invalid hostlist 'n[5-3]': bad range '5-3': end before start".to_string()));
        assert_eq!(expand("n[a-b]"), Err("invalid hostlist 'n[a-b]': bad range 'a-b'".to_string()));
        assert_eq!(expand("n[[1]]"), Err("invalid hostlist 'n[[1]]': nested '['".to_string()));
        assert!(expand("n[0-99999999]").is_err());
    }

    #[test]
    fn compresses_and_round_trips() {
        let cases: &[(&[&str], &str)] = &[
            (&["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"], "gpu[01-04,07]"),
            (&["n1", "n2", "n3", "login"], "n[1-3],login"),
            (&["vm"], "vm"),
            (&["n3"], "n3"),
            (&["n9", "n10", "n11"], "n[9-11]"),
            (&["gpu08", "gpu09", "gpu10"], "gpu[08-10]"),
            (&["n3", "n1", "n2", "n2"], "n[1-3]"),
            (&["a1", "b1", "a2"], "a[1-2],b1"),
            (&["n001", "n002", "n1"], "n[001-002],n1"),
        ];
        for (hosts, want) in cases {
            let hosts = names(hosts);
            assert_eq!(compress(&hosts), *want, "compress {hosts:?}");
            let mut back = expand(want).unwrap();
            let mut sorted = hosts.clone();
            sorted.sort();
            sorted.dedup();
            back.sort();
            assert_eq!(back, sorted, "round trip of {want}");
        }
        assert_eq!(compress(&[]), "");
    }

    #[test]
    fn a_million_hosts_in_a_thousand_groups_compress_back() {
        // Quadratic grouping took minutes on this (found by the hostlist fuzz target).
        let hosts = expand("r[1-1024]n[1-1024]").expect("a million hosts expand");
        assert_eq!(hosts.len(), 1 << 20);
        let text = compress(&hosts);
        let groups: Vec<&str> = text.split(',').collect();
        assert_eq!(groups.len(), 1024);
        assert_eq!(groups[0], "r1n[1-1024]");
        assert_eq!(groups[1023], "r1024n[1-1024]");
    }

    #[test]
    fn counts_compress_like_tasks_per_node() {
        assert_eq!(compress_counts(&[4, 4]), "4(x2)");
        assert_eq!(compress_counts(&[2, 2, 1]), "2(x2),1");
        assert_eq!(compress_counts(&[1]), "1");
        assert_eq!(compress_counts(&[]), "");
    }
}
