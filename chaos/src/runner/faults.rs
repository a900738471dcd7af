//! The faults a run injects, and its plan of them: a function of the seed.

use anyhow::bail;
use rand::rngs::StdRng;
use rand::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    Kill,
    Restart,
    Partition,
    Pause,
    SlowDisk,
    ClockSkew,
    /// SIGUSR2 (the daemon hands its runs over and exits, as in a rolling upgrade), then a new
    /// daemon after the hold: in time, it takes the runs over; too late, they were killed.
    Upgrade,
    // Faults of whole hosts, on the rig only (`corral-chaos rig`, see `on_rig`).
    /// SIGKILL of the host's PID 1: every process on it dies at once; booted again at the heal.
    Crash,
    /// `systemctl reboot` inside the host.
    Reboot,
    /// Every packet to or from the host dropped.
    Isolate,
    /// The host's packets to every other host dropped; it still hears them.
    OneWay,
    /// A share of the packets between the host and every other dropped, both ways.
    Loss,
    /// Latency between two racks of hosts, the host in one of them.
    Latency,
    /// The host's cgroup frozen: every process on it stops, corrald and jobs alike.
    Freeze,
    /// Every host's PID 1 killed at once, then all booted.
    PowerOff,
    /// The host's data directory (a FUSE layer) fails with EIO: its writes, or everything.
    FailDisk,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Restart => "restart",
            Fault::Partition => "partition",
            Fault::Pause => "pause",
            Fault::SlowDisk => "slow-disk",
            Fault::ClockSkew => "clock-skew",
            Fault::Upgrade => "upgrade",
            Fault::Crash => "crash",
            Fault::Reboot => "reboot",
            Fault::Isolate => "isolate",
            Fault::OneWay => "oneway",
            Fault::Loss => "loss",
            Fault::Latency => "latency",
            Fault::Freeze => "freeze",
            Fault::PowerOff => "poweroff-all",
            Fault::FailDisk => "fail-disk",
        }
    }

    /// Faults only the rig can inject: of whole hosts and their network.
    pub fn rig_only(self) -> bool {
        self > Fault::Upgrade
    }

    /// The node's fault file for the faults injected through one.
    pub(super) fn file_name(self) -> Option<&'static str> {
        match self {
            Fault::SlowDisk => Some("fault-slow-disk"),
            Fault::ClockSkew => Some("fault-clock-skew"),
            _ => None,
        }
    }

    pub fn parse_list(text: &str) -> anyhow::Result<Vec<Fault>> {
        let mut out = Vec::new();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let f = match word {
                "kill" => Fault::Kill,
                "restart" => Fault::Restart,
                "partition" => Fault::Partition,
                "pause" => Fault::Pause,
                "slow-disk" => Fault::SlowDisk,
                "clock-skew" => Fault::ClockSkew,
                "upgrade" => Fault::Upgrade,
                "crash" => Fault::Crash,
                "reboot" => Fault::Reboot,
                "isolate" => Fault::Isolate,
                "oneway" => Fault::OneWay,
                "loss" => Fault::Loss,
                "latency" => Fault::Latency,
                "freeze" => Fault::Freeze,
                "poweroff-all" => Fault::PowerOff,
                "fail-disk" => Fault::FailDisk,
                other => bail!(
                    "unknown fault '{other}' (kill, restart, partition, pause, slow-disk, clock-skew, upgrade; on the rig also \
                     crash, reboot, isolate, oneway, loss, latency, freeze, poweroff-all, fail-disk)"
                ),
            };
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out.sort();
        Ok(out)
    }
}

/// A scheduled fault: when (ms after the start), what, on which role, for how long.
#[derive(Clone, Debug)]
pub(super) struct PlannedFault {
    pub(super) at_ms: u64,
    pub(super) fault: Fault,
    pub(super) role: &'static str,
    pub(super) hold_ms: u64,
    pub(super) split_voters: bool,
    /// Slow disk: the WAL sync delay in ms; clock skew: the signed offset in ms.
    pub(super) amount: i64,
}

pub(super) fn plan_faults(rng: &mut StdRng, faults: &[Fault], duration_ms: u64, on_rig: bool) -> Vec<PlannedFault> {
    let supported: Vec<Fault> = faults.to_vec();
    let mut out = Vec::new();
    if supported.is_empty() {
        return out;
    }
    let mut t = rng.gen_range(4_000..8_000);
    // The last fault ends a while before the workload stops.
    while t + 10_000 < duration_ms {
        let fault = supported[rng.gen_range(0..supported.len())];
        let role = ["leader", "voter", "agent"][rng.gen_range(0..3)];
        let hold_ms = match fault {
            Fault::Pause => rng.gen_range(1_000..6_000),
            Fault::Restart => rng.gen_range(0..2_000),
            // Mostly well within the hand-over's deadline (`fence_after_ms` after the last
            // acknowledgement), sometimes past it.
            Fault::Upgrade if rng.gen_bool(0.8) => rng.gen_range(0..800),
            Fault::Upgrade => rng.gen_range(2_000..4_000),
            Fault::Reboot | Fault::PowerOff => rng.gen_range(0..3_000),
            _ => rng.gen_range(2_000..8_000),
        };
        let hold_ms = hold_ms.min(duration_ms.saturating_sub(t + 5_000));
        let amount = match fault {
            _ if on_rig => super::on_rig::amount(fault, rng),
            Fault::SlowDisk => rng.gen_range(20..1_500),
            // Up to ten minutes either way: commands then carry times out of order across leaders.
            Fault::ClockSkew => rng.gen_range(1_000..600_000) * if rng.gen_bool(0.5) { 1 } else { -1 },
            _ => 0,
        };
        out.push(PlannedFault { at_ms: t, fault, role, hold_ms, split_voters: rng.gen_bool(0.5), amount });
        t += hold_ms + rng.gen_range(3_000..10_000);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn fault_lists_parse() {
        let f = Fault::parse_list("pause,kill,slow-disk,kill").expect("valid list");
        assert_eq!(f, vec![Fault::Kill, Fault::Pause, Fault::SlowDisk]);
        assert!(Fault::parse_list("kill,meteor").is_err());
        let rig = Fault::parse_list("freeze,kill,poweroff-all").expect("valid list");
        assert_eq!(rig, vec![Fault::Kill, Fault::Freeze, Fault::PowerOff]);
        assert!(rig.iter().filter(|f| f.rig_only()).count() == 2 && !Fault::Upgrade.rig_only());
    }

    #[test]
    fn the_fault_plan_is_a_function_of_the_seed_and_ends_before_the_run() {
        let faults = [Fault::Kill, Fault::Partition, Fault::Pause, Fault::ClockSkew];
        let a = plan_faults(&mut StdRng::seed_from_u64(9), &faults, 120_000, false);
        let b = plan_faults(&mut StdRng::seed_from_u64(9), &faults, 120_000, false);
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert!(a.len() >= 5, "{a:?}");
        assert!(a.iter().all(|f| f.at_ms + f.hold_ms + 5_000 <= 120_000), "{a:?}");
        assert!(a.windows(2).all(|w| w[0].at_ms + w[0].hold_ms < w[1].at_ms), "faults never overlap: {a:?}");
        let disk = plan_faults(&mut StdRng::seed_from_u64(9), &[Fault::SlowDisk], 120_000, false);
        assert!(!disk.is_empty() && disk.iter().all(|f| (20..1_500).contains(&f.amount)), "{disk:?}");
        let skew = plan_faults(&mut StdRng::seed_from_u64(9), &[Fault::ClockSkew], 120_000, false);
        assert!(skew.iter().all(|f| (1_000..600_000).contains(&f.amount.abs())), "{skew:?}");
    }
}
