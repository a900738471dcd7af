//! What sysfs tells about a node's NICs, InfiniBand HCAs, NUMA nodes and PCI devices. Every
//! function takes the sysfs root (`/sys` on a real node) so tests can hand it a fake tree.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proto::Nic;
use tracing::debug;

use super::sysfs_pci_name;
use super::topo::parse_cpu_list;

/// The real sysfs.
pub const SYSFS_ROOT: &str = "/sys";

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// `numa_node` of a device directory; sysfs writes -1 where the platform has no NUMA.
fn numa_of(device_dir: &Path) -> Option<u32> {
    read_trimmed(&device_dir.join("numa_node")).and_then(|s| s.parse::<i64>().ok()).and_then(|n| u32::try_from(n).ok())
}

fn sorted_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// InfiniBand HCAs (`/sys/class/infiniband/*`, RoCE ones too) with their network interface, then
/// the other physical network interfaces (`/sys/class/net/*` with a `device`; no loopback,
/// bridges or veths). Each with the NUMA node of its PCI device.
pub fn discover_nics(sys_root: &Path) -> Vec<Nic> {
    let mut nics = Vec::new();
    let mut claimed: BTreeSet<String> = BTreeSet::new();
    let ib = sys_root.join("class/infiniband");
    for hca in sorted_names(&ib) {
        let device = ib.join(&hca).join("device");
        let netdev = sorted_names(&device.join("net")).into_iter().next();
        if let Some(n) = &netdev {
            claimed.insert(n.clone());
        }
        nics.push(Nic { name: hca, infiniband: true, numa_node: numa_of(&device), netdev });
    }
    let net = sys_root.join("class/net");
    for ifname in sorted_names(&net) {
        let device = net.join(&ifname).join("device");
        if ifname == "lo" || claimed.contains(&ifname) || !device.exists() {
            continue;
        }
        nics.push(Nic { name: ifname.clone(), infiniband: false, numa_node: numa_of(&device), netdev: Some(ifname) });
    }
    debug!(count = nics.len(), "nics discovered");
    nics
}

/// CPUs of each NUMA node (`/sys/devices/system/node/node*/cpulist`).
pub fn numa_cpus(sys_root: &Path) -> BTreeMap<u32, Vec<u32>> {
    let dir = sys_root.join("devices/system/node");
    let mut out = BTreeMap::new();
    for name in sorted_names(&dir) {
        let Some(node) = name.strip_prefix("node").and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Some(cpus) = read_trimmed(&dir.join(&name).join("cpulist")).and_then(|t| parse_cpu_list(&t)) {
            out.insert(node, cpus);
        }
    }
    out
}

/// NUMA node of the PCI device `bus_id` (any spelling: `00000000:18:00.0`).
pub fn pci_numa_node(sys_root: &Path, bus_id: &str) -> Option<u32> {
    numa_of(&sys_root.join("bus/pci/devices").join(sysfs_pci_name(bus_id)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    #[test]
    fn reads_a_fake_sysfs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(root, "class/infiniband/mlx5_1/device/numa_node", "1\n");
        write(root, "class/infiniband/mlx5_1/device/net/ib1/type", "32\n");
        write(root, "class/infiniband/mlx5_0/device/numa_node", "0\n");
        write(root, "class/infiniband/mlx5_0/device/net/ib0/type", "32\n");
        write(root, "class/net/ib0/device/numa_node", "0\n");
        write(root, "class/net/eth0/device/numa_node", "-1\n");
        write(root, "class/net/lo/type", "772\n");
        write(root, "class/net/docker0/type", "1\n");
        write(root, "devices/system/node/node0/cpulist", "0-3\n");
        write(root, "devices/system/node/node1/cpulist", "4-5,8\n");
        write(root, "devices/system/node/possible", "0-1\n");
        write(root, "bus/pci/devices/0000:2a:00.0/numa_node", "1\n");
        let nics = discover_nics(root);
        assert_eq!(
            nics,
            vec![
                Nic { name: "mlx5_0".into(), infiniband: true, numa_node: Some(0), netdev: Some("ib0".into()) },
                Nic { name: "mlx5_1".into(), infiniband: true, numa_node: Some(1), netdev: Some("ib1".into()) },
                Nic { name: "eth0".into(), infiniband: false, numa_node: None, netdev: Some("eth0".into()) },
            ]
        );
        let cpus = numa_cpus(root);
        assert_eq!(cpus.get(&0), Some(&vec![0, 1, 2, 3]));
        assert_eq!(cpus.get(&1), Some(&vec![4, 5, 8]));
        assert_eq!(pci_numa_node(root, "00000000:2A:00.0"), Some(1));
        assert_eq!(pci_numa_node(root, "00000000:3A:00.0"), None);
        assert!(discover_nics(&root.join("missing")).is_empty());
    }
}
