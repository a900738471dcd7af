//! GPU discovery behind one trait. The simulated probe stands in where there is no GPU; every
//! step after discovery is the same code for simulated and real GPUs. The probes themselves
//! live in `crate::gpu`; this module is the node's entry point to them.

pub use crate::gpu::{probe_from_config, GpuInventory, GpuProbe, SimulatedProbe};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_inventory_is_stable_and_typed() {
        let discover = |spec: &str, node: &str| probe_from_config(spec, node).discover();
        let a = discover("h100:8", "n1").expect("discover").gpus;
        let b = discover("h100:8", "n1").expect("discover again").gpus;
        assert_eq!(a, b);
        assert_eq!(a.len(), 8);
        assert_eq!(a[3].index, 3);
        assert_eq!(a[0].gres_type, "h100");
        assert_eq!(a[0].memory_mib, 81_559);
        assert!(a[0].uuid.starts_with("GPU-") && a[0].uuid.len() == 40, "{}", a[0].uuid);
        let other = discover("h100:8", "n2").expect("n2").gpus;
        assert_ne!(a[0].uuid, other[0].uuid);
        assert!(discover("x999:2", "n").is_err());
        assert!(discover("h100:lots", "n").is_err());
        assert!(discover("none", "n").expect("none").gpus.is_empty());
    }
}
