//! The capabilities this process holds in effect (`CapEff` in `/proc/self/status`). Root is not
//! enough to know what corrald may do: systemd's `CapabilityBoundingSet` (or a container's) takes
//! capabilities from root, and a feature that needs a missing one is turned off at start, with
//! one warning, instead of failing every job that would use it.

use std::path::Path;

/// `CAP_SYS_ADMIN` (linux/capability.h): a mount namespace per run (`/job`, `job_hosts_file`).
pub const CAP_SYS_ADMIN: u32 = 21;

/// Why the effective set could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CapabilitiesError {
    #[error("no CapEff line")]
    Missing,
    #[error("CapEff '{0}' is not a 64-bit hexadecimal mask")]
    Malformed(String),
}

/// A set of capabilities, bit N for capability number N.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities(u64);

impl Capabilities {
    /// The effective set of the process whose `/proc/PID/status` text this is.
    pub fn from_status(status: &str) -> Result<Self, CapabilitiesError> {
        let value = status.lines().find_map(|line| line.strip_prefix("CapEff:")).map(str::trim).ok_or(CapabilitiesError::Missing)?;
        if value.is_empty() || value.len() > 16 {
            return Err(CapabilitiesError::Malformed(value.to_string()));
        }
        u64::from_str_radix(value, 16).map(Self).map_err(|_| CapabilitiesError::Malformed(value.to_string()))
    }

    /// The effective set of this process.
    pub fn of_this_process() -> anyhow::Result<Self> {
        Self::read(Path::new("/proc/self/status"))
    }

    fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("read {}: {e}", path.display()))?;
        Self::from_status(&text).map_err(|e| anyhow::anyhow!("parse {}: {e}", path.display()))
    }

    /// Whether capability number `cap` is in the set.
    pub fn has(self, cap: u32) -> bool {
        cap < 64 && self.0 & (1 << cap) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(cap_eff: &str) -> String {
        format!("Name:\tcorrald\nUmask:\t0022\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t{cap_eff}\nCapBnd:\t000001ffffffffff\n")
    }

    #[test]
    fn full_root_set_has_sys_admin() {
        let caps = Capabilities::from_status(&status("000001ffffffffff")).expect("parse");
        assert!(caps.has(CAP_SYS_ADMIN));
        assert!(caps.has(0) && caps.has(40));
        assert!(!caps.has(41) && !caps.has(64) && !caps.has(u32::MAX));
    }

    #[test]
    fn the_old_unit_bounding_set_lacks_sys_admin() {
        // CAP_CHOWN 0, CAP_DAC_READ_SEARCH 2, CAP_KILL 5, CAP_SETGID 6, CAP_SETUID 7: what
        // corrald.service left root before CAP_SYS_ADMIN was added.
        let caps = Capabilities::from_status(&status("00000000000000e5")).expect("parse");
        assert_eq!(caps, Capabilities(0b1110_0101));
        assert!(caps.has(7) && caps.has(2));
        assert!(!caps.has(CAP_SYS_ADMIN));
        // ... and with it (bit 21).
        assert!(Capabilities::from_status(&status("00000000002000e5")).expect("parse").has(CAP_SYS_ADMIN));
    }

    #[test]
    fn an_unprivileged_process_has_none() {
        let caps = Capabilities::from_status(&status("0000000000000000")).expect("parse");
        assert_eq!(caps, Capabilities(0));
        assert!(!caps.has(CAP_SYS_ADMIN));
    }

    #[test]
    fn bad_text_is_an_error() {
        assert_eq!(Capabilities::from_status("Name:\tx\nCapPrm:\t0\n"), Err(CapabilitiesError::Missing));
        assert_eq!(Capabilities::from_status(""), Err(CapabilitiesError::Missing));
        for bad in ["", "zz", "-1", "0x21", "1ffffffffffffffff", "00 00"] {
            assert_eq!(Capabilities::from_status(&status(bad)), Err(CapabilitiesError::Malformed(bad.trim().to_string())), "{bad:?}");
        }
    }

    #[test]
    fn this_process_has_a_readable_set() {
        let caps = Capabilities::of_this_process().expect("read /proc/self/status");
        // Root in a full set holds CAP_SYS_ADMIN, another user none; both are possible here,
        // but the set must agree with what the kernel lets this process do: an unprivileged
        // process has an empty effective set.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            assert_eq!(caps, Capabilities(0));
        }
        assert!(Capabilities::read(Path::new("/nonexistent/status")).is_err());
    }
}
