//! On a host without libnvidia-ml (CI, this machine) the NVML probe fails cleanly and
//! `gpus = "auto"` gives no GPUs. On a GPU host it finds them.

use corral_node::gpu::nvml::NvmlProbe;
use corral_node::gpu::{probe_from_config, GpuError};

fn nvml_loads() -> bool {
    NvmlProbe::new().is_ok()
}

#[test]
fn auto_without_nvml_means_no_gpus() {
    if nvml_loads() {
        let inv = probe_from_config("auto", "n1").discover().expect("discover through nvml");
        assert!(inv.gpus.iter().all(|g| g.uuid.starts_with("GPU-")));
        return;
    }
    match NvmlProbe::new() {
        Err(GpuError::NvmlUnavailable(why)) => assert!(!why.is_empty()),
        Err(e) => panic!("expected NvmlUnavailable, got {e}"),
        Ok(_) => unreachable!(),
    }
    let auto = probe_from_config("auto", "n1");
    assert_eq!(auto.kind(), "none");
    assert!(auto.discover().expect("auto discovers nothing").gpus.is_empty());
    let err = probe_from_config("nvml", "n1").discover().expect_err("nvml required");
    assert!(format!("{err:#}").contains("nvml"), "{err:#}");
}
