//! GPU discovery behind one trait. The simulated probe stands in where there is no GPU; every
//! step after discovery is the same code for simulated and real GPUs.

use anyhow::{bail, Context};
use proto::GpuInfo;
use sha2::{Digest, Sha256};

pub trait GpuProbe: Send + Sync {
    /// The GPUs of this node, in index order.
    fn discover(&self) -> anyhow::Result<Vec<GpuInfo>>;
}

/// `h100:8` gives eight H100-80GB GPUs whose UUIDs are stable for a given node name.
pub struct SimulatedProbe {
    pub node_name: String,
    pub spec: String,
}

/// (gres type, model name, memory in MiB) of the GPU models the simulator knows.
const MODELS: &[(&str, &str, u64)] = &[
    ("h100", "NVIDIA H100 80GB HBM3", 81_559),
    ("h200", "NVIDIA H200", 143_771),
    ("a100", "NVIDIA A100-SXM4-80GB", 81_920),
    ("l40s", "NVIDIA L40S", 46_068),
];

impl GpuProbe for SimulatedProbe {
    fn discover(&self) -> anyhow::Result<Vec<GpuInfo>> {
        let spec = self.spec.trim();
        if spec.is_empty() || spec == "none" {
            return Ok(Vec::new());
        }
        let (kind, count) = spec.split_once(':').with_context(|| format!("parse gpus '{spec}': expected TYPE:N"))?;
        let count: u32 = count.parse().with_context(|| format!("parse gpu count in '{spec}'"))?;
        if count > 64 {
            bail!("a simulated node holds at most 64 gpus, not {count}");
        }
        let Some(&(gres_type, model, memory_mib)) = MODELS.iter().find(|m| m.0 == kind) else {
            let known: Vec<&str> = MODELS.iter().map(|m| m.0).collect();
            bail!("unknown gpu type '{kind}' (known: {})", known.join(", "));
        };
        Ok((0..count)
            .map(|index| GpuInfo {
                index,
                uuid: stable_uuid(&self.node_name, index),
                model: model.to_string(),
                gres_type: gres_type.to_string(),
                memory_mib,
                healthy: true,
                ..GpuInfo::default()
            })
            .collect())
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, derived from the node name and index.
fn stable_uuid(node: &str, index: u32) -> String {
    let digest = Sha256::digest(format!("corral-sim/{node}/{index}").as_bytes());
    let h = hex::encode(&digest[..16]);
    format!("GPU-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_inventory_is_stable_and_typed() {
        let probe = SimulatedProbe { node_name: "n1".into(), spec: "h100:8".into() };
        let a = probe.discover().expect("discover");
        let b = probe.discover().expect("discover again");
        assert_eq!(a, b);
        assert_eq!(a.len(), 8);
        assert_eq!(a[3].index, 3);
        assert_eq!(a[0].gres_type, "h100");
        assert_eq!(a[0].memory_mib, 81_559);
        assert!(a[0].uuid.starts_with("GPU-") && a[0].uuid.len() == 40, "{}", a[0].uuid);
        let other = SimulatedProbe { node_name: "n2".into(), spec: "h100:8".into() }.discover().expect("n2");
        assert_ne!(a[0].uuid, other[0].uuid);
        assert!(SimulatedProbe { node_name: "n".into(), spec: "x999:2".into() }.discover().is_err());
        assert!(SimulatedProbe { node_name: "n".into(), spec: "h100:lots".into() }.discover().is_err());
        assert!(SimulatedProbe { node_name: "n".into(), spec: "none".into() }.discover().expect("none").is_empty());
    }
}
