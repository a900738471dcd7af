//! Entry points of the fuzz targets (`fuzz/`) and the stable fuzz smoke test for what the Slurm
//! shims parse from users: `#SBATCH` scripts and their options, hostlists, time limits. Each
//! returns for every input and never panics.

/// A batch script: its directives, the job they describe, and the option parsers they reach.
pub fn sbatch_script(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let directives = super::sbatch::directives(&text, "#SBATCH");
    let _ = super::sbatch::spec_from_directives(&text, "fuzz", Vec::new(), &[]);
    for d in &directives {
        let _ = super::sbatch::parse_array(d);
        let _ = super::sbatch::parse_dependencies(d);
        let _ = super::sbatch::parse_gres(d);
        let _ = super::sbatch::parse_signal(d);
        let _ = super::sbatch::parse_mem_mib(d);
        let _ = super::time::parse_limit_s(d);
    }
}

/// A hostlist: expanding is bounded, and what expands compresses back to the same hosts.
pub fn hostlist(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(hosts) = slurm_compat::hostlist::expand(&text) {
        let again = slurm_compat::hostlist::compress(&hosts);
        let mut sorted = hosts.clone();
        sorted.sort();
        sorted.dedup();
        if let Ok(back) = slurm_compat::hostlist::expand(&again) {
            let mut back_sorted = back.clone();
            back_sorted.sort();
            back_sorted.dedup();
            assert_eq!(back_sorted, sorted, "compress then expand of {text:?} changed the hosts");
        }
    }
}
