//! Inside a node: which free GPUs (or MIG instances) a job gets, so they talk best to each other
//! and to the job's CPUs, and so partly used domains fill first.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BTreeMap;

use proto::Link;

use crate::view::NodeView;

/// Lower is better: X 0, NV# 1, PIX 2, PXB 3, PHB 4, NODE 5, SYS 6. Without a link matrix,
/// GPUs of one NUMA node count as NODE, others as SYS.
pub fn link_rank(node: &NodeView, a: usize, b: usize) -> u32 {
    if a == b {
        return 0;
    }
    let (ga, gb) = (&node.gpus[a], &node.gpus[b]);
    match node.gpu_links.get(ga.index as usize).and_then(|row| row.get(gb.index as usize)) {
        Some(Link::X) => 0,
        Some(Link::NvLink(_)) => 1,
        Some(Link::Pix) => 2,
        Some(Link::Pxb) => 3,
        Some(Link::Phb) => 4,
        Some(Link::Node) => 5,
        Some(Link::Sys) => 6,
        None => match (ga.numa_node, gb.numa_node) {
            (Some(x), Some(y)) if x == y => 5,
            _ => 6,
        },
    }
}

/// Cost of giving the GPUs at positions `set` (sorted) to a job; compared lexicographically.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cost {
    /// Worst link between two chosen GPUs.
    worst: u32,
    /// NUMA domains spanned.
    numas: u32,
    /// CPUs the GPUs' NUMA domains cannot give.
    cpu_spill: u32,
    link_sum: u32,
    /// Free GPUs in the touched NUMA domains before: fewer means a partly used domain (pack).
    domain_free: u32,
    /// Free GPUs left out that sit at PIX or better to a chosen one (pairs kept whole).
    partners_left: u32,
    indices: Vec<u32>,
}

fn cost(node: &NodeView, free: &[usize], set: &[usize], cpus: u32) -> Cost {
    let mut worst = 0;
    let mut link_sum = 0;
    for (i, &a) in set.iter().enumerate() {
        for &b in &set[i + 1..] {
            let r = link_rank(node, a, b);
            worst = worst.max(r);
            link_sum += r;
        }
    }
    let mut numas: Vec<Option<u32>> = set.iter().map(|&p| node.gpus[p].numa_node).collect();
    numas.sort();
    numas.dedup();
    let cpus_near: u32 = numas
        .iter()
        .flatten()
        .map(|n| node.numa.iter().find(|d| d.numa == *n).map_or(0, |d| d.cpus_total.saturating_sub(d.cpus_used)))
        .sum();
    let domain_free = free.iter().filter(|&&p| numas.contains(&node.gpus[p].numa_node)).count() as u32;
    let partners_left =
        free.iter().filter(|p| !set.contains(p)).filter(|&&p| set.iter().any(|&s| link_rank(node, s, p) <= 2)).count() as u32;
    let mut indices: Vec<u32> = set.iter().map(|&p| node.gpus[p].index).collect();
    indices.sort_unstable();
    Cost { worst, numas: numas.len() as u32, cpu_spill: cpus.saturating_sub(cpus_near), link_sum, domain_free, partners_left, indices }
}

/// Chooses `k` of the free GPU positions `free` (ascending) for a job that also needs `cpus`.
/// Each free GPU seeds a set grown greedily by best link; the cheapest set wins. O(free² · k).
/// Returns positions sorted by GPU index; `None` when fewer than `k` are free.
pub fn pick_gpus(node: &NodeView, free: &[usize], k: usize, cpus: u32) -> Option<Vec<usize>> {
    if free.len() < k {
        return None;
    }
    if k == 0 {
        return Some(Vec::new());
    }
    let by_index = |v: &mut Vec<usize>| v.sort_by_key(|&p| node.gpus[p].index);
    if free.len() == k {
        let mut all = free.to_vec();
        by_index(&mut all);
        return Some(all);
    }
    let mut best: Option<(Cost, Vec<usize>)> = None;
    for &seed in free {
        let mut set = vec![seed];
        while set.len() < k {
            let next = free
                .iter()
                .filter(|p| !set.contains(p))
                .min_by_key(|&&p| {
                    let worst = set.iter().map(|&s| link_rank(node, s, p)).max().unwrap_or(0);
                    let sum: u32 = set.iter().map(|&s| link_rank(node, s, p)).sum();
                    let other_numa = node.gpus[p].numa_node != node.gpus[seed].numa_node;
                    (worst, sum, other_numa, node.gpus[p].index)
                })
                .copied();
            match next {
                Some(p) => set.push(p),
                None => break,
            }
        }
        if set.len() < k {
            continue;
        }
        by_index(&mut set);
        let c = cost(node, free, &set, cpus);
        if best.as_ref().is_none_or(|(b, _)| c < *b) {
            best = Some((c, set));
        }
    }
    best.map(|(_, s)| s)
}

/// Chooses `k` free MIG instances from `free` (gpu position, instance position): instances on
/// the GPU with the fewest free ones first (pack), then by GPU index and start slice.
pub fn pick_mig(node: &NodeView, free: &[(usize, usize)], k: usize) -> Option<Vec<(usize, usize)>> {
    if free.len() < k {
        return None;
    }
    let mut free_on_gpu: BTreeMap<usize, u32> = BTreeMap::new();
    for &(g, _) in free {
        *free_on_gpu.entry(g).or_default() += 1;
    }
    let mut order = free.to_vec();
    order.sort_by_key(|&(g, i)| (free_on_gpu.get(&g).copied().unwrap_or(0), node.gpus[g].index, node.gpus[g].mig[i].start_slice));
    order.truncate(k);
    Some(order)
}

/// The NIC nearest the chosen GPUs: on their (most common) NUMA node, InfiniBand first, then
/// by name.
pub fn nearest_nic(node: &NodeView, gpu_positions: &[usize]) -> Option<String> {
    let mut count: BTreeMap<u32, u32> = BTreeMap::new();
    for &p in gpu_positions {
        if let Some(n) = node.gpus[p].numa_node {
            *count.entry(n).or_default() += 1;
        }
    }
    let numa = count.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(&n, _)| n);
    node.nics
        .iter()
        .filter(|n| numa.is_none() || n.numa_node == numa)
        .min_by(|a, b| b.infiniband.cmp(&a.infiniband).then(a.name.cmp(&b.name)))
        .map(|n| n.name.clone())
}

/// Picks `n` of `cands` (ordered by free capacity, then id) for a gang: the tightest NVLink
/// domain, then leaf switch, then block that holds them all (keeping larger ones free), else
/// the fewest switches across blocks. `required` nodes are always in.
pub(crate) fn choose_gang(nodes: &[Cow<'_, NodeView>], cands: &[usize], n: usize, required: &[usize]) -> Vec<usize> {
    type KeyFn = fn(&NodeView) -> Option<&str>;
    let levels: [KeyFn; 3] = [|v| v.location.nvlink_domain.as_deref(), |v| v.location.switch.as_deref(), |v| v.location.block.as_deref()];
    let switch_sizes = group_sizes(nodes, cands, |v| v.location.switch.as_deref());
    let rank: BTreeMap<usize, usize> = cands.iter().enumerate().map(|(i, &c)| (c, i)).collect();
    let order_in = |group: &[usize]| -> Vec<usize> {
        let mut g = group.to_vec();
        // Fullest switches first (fewest switches), then the candidate order.
        g.sort_by_key(|&c| {
            let sw = nodes[c].location.switch.as_deref();
            (!required.contains(&c), Reverse(switch_sizes.get(&sw).copied().unwrap_or(0)), sw, rank.get(&c).copied())
        });
        g.truncate(n);
        g
    };
    for key in levels {
        let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for &c in cands {
            if let Some(k) = key(&nodes[c]) {
                groups.entry(k).or_default().push(c);
            }
        }
        let best =
            groups.iter().filter(|(_, g)| g.len() >= n && required.iter().all(|r| g.contains(r))).min_by_key(|(k, g)| (g.len(), **k));
        if let Some((_, g)) = best {
            return order_in(g);
        }
    }
    let block_sizes = group_sizes(nodes, cands, |v| v.location.block.as_deref());
    let mut all = cands.to_vec();
    all.sort_by_key(|&c| {
        let v = &nodes[c];
        let (b, sw) = (v.location.block.as_deref(), v.location.switch.as_deref());
        (
            !required.contains(&c),
            Reverse(block_sizes.get(&b).copied().unwrap_or(0)),
            b,
            Reverse(switch_sizes.get(&sw).copied().unwrap_or(0)),
            sw,
            rank.get(&c).copied(),
        )
    });
    all.truncate(n);
    all
}

fn group_sizes<'a>(
    nodes: &'a [Cow<'_, NodeView>],
    cands: &[usize],
    key: fn(&NodeView) -> Option<&str>,
) -> BTreeMap<Option<&'a str>, usize> {
    let mut m: BTreeMap<Option<&str>, usize> = BTreeMap::new();
    for &c in cands {
        *m.entry(key(&nodes[c])).or_default() += 1;
    }
    m
}
