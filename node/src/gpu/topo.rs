//! `nvidia-smi topo -m`: the GPU-to-GPU link matrix, each GPU's CPU and NUMA affinity, and the
//! NICs the matrix names. Also how a `Link` is spelled there (`NV18`, `PIX`, `SYS`, ...).

use std::collections::BTreeMap;

use proto::Link;

/// Parses one matrix cell: `X`, `NV18`, `PIX`, `PXB`, `PHB`, `NODE` (or the older `CPU`), `SYS`
/// (or the older `SOC`).
pub fn parse_link(cell: &str) -> Option<Link> {
    let cell = cell.trim();
    Some(match cell {
        "X" => Link::X,
        "PIX" => Link::Pix,
        "PXB" => Link::Pxb,
        "PHB" => Link::Phb,
        "NODE" | "CPU" => Link::Node,
        "SYS" | "SOC" => Link::Sys,
        _ => Link::NvLink(cell.strip_prefix("NV")?.parse().ok()?),
    })
}

/// How `nvidia-smi topo -m` prints `link`.
pub fn link_name(link: Link) -> String {
    match link {
        Link::X => "X".into(),
        Link::NvLink(n) => format!("NV{n}"),
        Link::Pix => "PIX".into(),
        Link::Pxb => "PXB".into(),
        Link::Phb => "PHB".into(),
        Link::Node => "NODE".into(),
        Link::Sys => "SYS".into(),
    }
}

/// Expands a CPU list such as `0-15,32-47` (sysfs `cpulist` and topo's CPU Affinity column).
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let text = text.trim();
    if text.is_empty() || text == "N/A" {
        return Some(Vec::new());
    }
    let mut cpus = Vec::new();
    for part in text.split(',') {
        match part.trim().split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 65_536 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// What `nvidia-smi topo -m` tells about the GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopoMatrix {
    /// `gpu_links[i][j]`, GPUs in index order.
    pub gpu_links: Vec<Vec<Link>>,
    /// CPUs close to each GPU.
    pub gpu_cpus: Vec<Vec<u32>>,
    /// NUMA node of each GPU's CPUs (`NUMA Affinity`).
    pub gpu_numa: Vec<Option<u32>>,
    /// Device name of each NIC column (`NIC0` → `mlx5_0`), from the legend.
    pub nics: Vec<String>,
    /// `gpu_nic_links[i][k]`: link from GPU i to NIC k.
    pub gpu_nic_links: Vec<Vec<Link>>,
}

impl TopoMatrix {
    /// NUMA node → CPUs, from the GPUs' affinities.
    pub fn numa_cpus(&self) -> BTreeMap<u32, Vec<u32>> {
        let mut out: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (numa, cpus) in self.gpu_numa.iter().zip(&self.gpu_cpus) {
            if let Some(n) = numa {
                let entry = out.entry(*n).or_default();
                entry.extend(cpus);
                entry.sort_unstable();
                entry.dedup();
            }
        }
        out
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TopoParseError {
    #[error("no header line naming GPU0")]
    NoHeader,
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

/// Parses the text of `nvidia-smi topo -m`.
pub fn parse_topo_matrix(text: &str) -> Result<TopoMatrix, TopoParseError> {
    let lines: Vec<&str> = text.lines().collect();
    let header_at = lines.iter().position(|l| l.split('\t').any(|c| c.trim() == "GPU0")).ok_or(TopoParseError::NoHeader)?;
    // The header starts with an empty cell; rows start with their own name.
    let header: Vec<String> = lines[header_at].split('\t').skip(1).map(|c| c.trim().to_string()).collect();
    let col = |name: &str| header.iter().position(|h| h == name);
    let gpu_cols: Vec<usize> = (0..).map_while(|i| col(&format!("GPU{i}"))).collect();
    let nic_cols: Vec<usize> = (0..).map_while(|i| col(&format!("NIC{i}"))).collect();
    let (cpu_col, numa_col) = (col("CPU Affinity"), col("NUMA Affinity"));
    let mut m = TopoMatrix::default();
    for (offset, line) in lines[header_at + 1..].iter().enumerate() {
        let line_no = header_at + offset + 2;
        let cells: Vec<&str> = line.split('\t').collect();
        let Some(name) = cells.first().map(|c| c.trim()) else { continue };
        let Some(index) = name.strip_prefix("GPU").and_then(|i| i.parse::<usize>().ok()) else {
            if let Some((nic, dev)) = name.split_once(':') {
                let is_nic = nic.trim().strip_prefix("NIC").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
                if is_nic && !dev.trim().is_empty() {
                    m.nics.push(dev.trim().to_string());
                }
            }
            continue;
        };
        if index != m.gpu_links.len() {
            return Err(TopoParseError::Line { line: line_no, reason: format!("GPU{index} out of order") });
        }
        let cell = |c: usize| cells.get(c + 1).map(|s| s.trim()).unwrap_or("");
        let parse_row = |cols: &[usize]| -> Result<Vec<Link>, TopoParseError> {
            cols.iter()
                .map(|&c| {
                    parse_link(cell(c)).ok_or_else(|| TopoParseError::Line { line: line_no, reason: format!("bad link '{}'", cell(c)) })
                })
                .collect()
        };
        m.gpu_links.push(parse_row(&gpu_cols)?);
        m.gpu_nic_links.push(parse_row(&nic_cols)?);
        let cpus = match cpu_col {
            Some(c) => parse_cpu_list(cell(c))
                .ok_or_else(|| TopoParseError::Line { line: line_no, reason: format!("bad cpu list '{}'", cell(c)) })?,
            None => Vec::new(),
        };
        m.gpu_cpus.push(cpus);
        m.gpu_numa.push(numa_col.and_then(|c| cell(c).parse().ok()));
    }
    if m.gpu_links.len() != gpu_cols.len() {
        return Err(TopoParseError::Line {
            line: header_at + 1,
            reason: format!("{} GPU columns but {} GPU rows", gpu_cols.len(), m.gpu_links.len()),
        });
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_round_trip() {
        for l in [Link::X, Link::NvLink(18), Link::Pix, Link::Pxb, Link::Phb, Link::Node, Link::Sys] {
            assert_eq!(parse_link(&link_name(l)), Some(l));
        }
        assert_eq!(parse_link("NVx"), None);
        assert_eq!(parse_link("SOC"), Some(Link::Sys));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpu_list("N/A"), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn two_gpus_and_a_nic() {
        let text = "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
GPU0\t X \tNV18\tPIX\t0-3\t0\t\tN/A\n\
GPU1\tNV18\t X \tSYS\t4-7\t1\t\tN/A\n\
NIC0\tPIX\tSYS\t X \n\nNIC Legend:\n\n  NIC0: mlx5_0\n";
        let m = parse_topo_matrix(text).expect("parse");
        assert_eq!(m.gpu_links, vec![vec![Link::X, Link::NvLink(18)], vec![Link::NvLink(18), Link::X]]);
        assert_eq!(m.gpu_nic_links, vec![vec![Link::Pix], vec![Link::Sys]]);
        assert_eq!(m.gpu_numa, vec![Some(0), Some(1)]);
        assert_eq!(m.nics, vec!["mlx5_0".to_string()]);
        assert_eq!(m.numa_cpus().get(&1), Some(&vec![4, 5, 6, 7]));
        assert!(parse_topo_matrix("nothing here").is_err());
    }
}
