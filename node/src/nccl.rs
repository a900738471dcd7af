//! NCCL settings from a node's hardware: the interface that carries the cluster's data network,
//! the InfiniBand HCAs nearest the GPUs, or `NCCL_IB_DISABLE=1` where there is no InfiniBand.

use std::collections::BTreeSet;
use std::net::IpAddr;

use proto::Inventory;

use crate::config::NcclConfig;
use crate::run::launcher::NcclEnv;

/// The name of the network interface holding `ip`, from getifaddrs(3).
pub fn interface_of(ip: IpAddr) -> Option<String> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, valid until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points at a sockaddr of the family it names.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let addr = match family {
            libc::AF_INET => {
                // SAFETY: AF_INET addresses are sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes())
            }
            libc::AF_INET6 => {
                // SAFETY: AF_INET6 addresses are sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                IpAddr::from(sin6.sin6_addr.s6_addr)
            }
            _ => continue,
        };
        if addr == ip {
            // SAFETY: ifa_name is a NUL-terminated C string owned by the list.
            found = Some(unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned());
            break;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// NCCL settings for jobs on this node: the config's overrides, else derived from `inventory`
/// and the interface of `advertise` (`host:port`).
pub fn derive(config: &NcclConfig, inventory: &Inventory, advertise: &str) -> NcclEnv {
    let ip: Option<IpAddr> = advertise.rsplit_once(':').and_then(|(h, _)| h.trim_matches(['[', ']']).parse().ok());
    let socket_ifname = config.socket_ifname.clone().or_else(|| ip.and_then(interface_of));
    let gpu_numa: BTreeSet<u32> = inventory.gpus.iter().filter_map(|g| g.numa_node).collect();
    let ib: Vec<&proto::Nic> = inventory.topology.nics.iter().filter(|n| n.infiniband).collect();
    let near: Vec<&str> = ib.iter().filter(|n| n.numa_node.is_some_and(|d| gpu_numa.contains(&d))).map(|n| n.name.as_str()).collect();
    let chosen: Vec<&str> = if near.is_empty() { ib.iter().map(|n| n.name.as_str()).collect() } else { near };
    let ib_hca = config.ib_hca.clone().or_else(|| (!chosen.is_empty()).then(|| chosen.join(",")));
    let ib_disable = config.ib_disable.unwrap_or(ib.is_empty());
    NcclEnv { socket_ifname, ib_hca, ib_disable }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{GpuInfo, Nic, Topology};

    #[test]
    fn loopback_interface_and_derived_settings() {
        assert_eq!(interface_of("127.0.0.1".parse().expect("ip")).as_deref(), Some("lo"));
        let plain = derive(&NcclConfig::default(), &Inventory::default(), "127.0.0.1:7100");
        assert_eq!(plain, NcclEnv { socket_ifname: Some("lo".into()), ib_hca: None, ib_disable: true });
        let inventory = Inventory {
            gpus: vec![GpuInfo { numa_node: Some(1), ..GpuInfo::default() }],
            topology: Topology {
                nics: vec![
                    Nic { name: "mlx5_0".into(), infiniband: true, numa_node: Some(0), netdev: Some("ib0".into()) },
                    Nic { name: "mlx5_1".into(), infiniband: true, numa_node: Some(1), netdev: Some("ib1".into()) },
                ],
                ..Topology::default()
            },
            ..Inventory::default()
        };
        let ib = derive(&NcclConfig::default(), &inventory, "127.0.0.1:7100");
        assert_eq!((ib.ib_hca.as_deref(), ib.ib_disable), (Some("mlx5_1"), false));
        let forced = NcclConfig { socket_ifname: Some("eth9".into()), ib_hca: Some("mlx5_7".into()), ib_disable: Some(true) };
        assert_eq!(
            derive(&forced, &inventory, "10.1.1.1:7100"),
            NcclEnv { socket_ifname: Some("eth9".into()), ib_hca: Some("mlx5_7".into()), ib_disable: true }
        );
    }
}
