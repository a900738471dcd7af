//! The runner on the rig: boots the hosts, injects each planned fault from outside the daemons
//! through `hosts.sh` (or systemd inside a host, for the daemon's own faults) and heals it.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{drive_and_check, finish, now_ms, Fault, Harness, PlannedFault, RunOptions, RunOutcome};
use crate::rig::{Frozen, Rig};

/// A rebooted host runs again within this.
const REBOOT_BOUND: Duration = Duration::from_secs(30);

/// Boots the rig, drives the workload and its faults, checks, then heals and stops the rig.
pub(super) fn run(mut h: Harness, script: &Path, opts: &RunOptions) -> anyhow::Result<RunOutcome> {
    let rig = Rig::new(script, &h.dir, opts.nodes, opts.faults.contains(&Fault::FailDisk));
    if let Err(e) = rig.up() {
        let _ = rig.down();
        return Err(e.context("boot the hosts and form the cluster"));
    }
    h.rig = Some(rig.clone());
    let result = drive_and_check(&mut h, opts);
    let healed = h.heal_all();
    let down = rig.down().and(healed);
    finish(result, down, opts, &h.dir)
}

/// A fault's amount on the rig: IOPS of a slow disk, seconds of skew, a loss's percent, a
/// latency's ms each way.
pub(super) fn amount(fault: Fault, rng: &mut StdRng) -> i64 {
    match fault {
        Fault::SlowDisk => rng.gen_range(5..100),
        Fault::ClockSkew => rng.gen_range(60..86_400),
        Fault::Loss => rng.gen_range(10..60),
        Fault::Latency => rng.gen_range(20..100),
        // 0: writes fail; 1: reads too.
        Fault::FailDisk => rng.gen_range(0..2),
        _ => 0,
    }
}

fn rig(h: &Harness) -> anyhow::Result<Rig> {
    h.rig.clone().context("no rig is up")
}

/// Signals the host's corrald (its main process only: KillMode=process) through systemd.
fn signal_daemon(rig: &Rig, host: &str, sig: &str) -> anyhow::Result<()> {
    rig.exec(host, &["systemctl", "kill", &format!("--signal={sig}"), "--kill-whom=main", "corrald"]).map(|_| ())
}

/// Injects `f` on `node` (`voters`: the voters now, for a partition that splits them).
pub(super) fn inject(h: &mut Harness, f: &PlannedFault, node: &str, voters: &[String], rng: &mut StdRng) -> anyhow::Result<()> {
    let rig = rig(h)?;
    let others: Vec<String> = rig.hosts.iter().filter(|o| *o != node).cloned().collect();
    let amount = f.amount.to_string();
    let mut detail = json!(f.amount);
    match f.fault {
        // The daemon's own faults, through the host's systemd: it starts corrald again
        // (Restart=on-failure; a hand-over exits 75).
        Fault::Kill => signal_daemon(&rig, node, "SIGKILL")?,
        Fault::Restart => rig.exec(node, &["systemctl", "restart", "--no-block", "corrald"]).map(|_| ())?,
        Fault::Upgrade => {
            rig.install(node)?;
            signal_daemon(&rig, node, "SIGUSR2")?;
        }
        Fault::Pause => {
            signal_daemon(&rig, node, "SIGSTOP")?;
            h.paused.insert(node.to_string());
        }
        Fault::Partition => {
            // From the other voters only (a voter), or from every other host.
            let group: Vec<String> = if f.split_voters && voters.iter().any(|v| v == node) {
                voters.iter().filter(|v| *v != node).cloned().collect()
            } else {
                others.clone()
            };
            detail = json!(group);
            rig.fault("partition", &[node.to_string(), group.join(",")])?;
            h.partitioned.insert(node.to_string());
        }
        Fault::Isolate => rig.fault("isolate", &[node.to_string()])?,
        Fault::OneWay => {
            for o in &others {
                rig.fault("oneway", &[node.to_string(), o.clone()])?;
            }
        }
        Fault::Loss => {
            for o in &others {
                rig.fault("loss", &[amount.clone(), node.to_string(), o.clone()])?;
            }
        }
        Fault::Latency => {
            // Two racks: the node (and, half the time, one more host) against the rest.
            let mut rack = vec![node.to_string()];
            if f.split_voters && others.len() > 1 {
                rack.push(others[rng.gen_range(0..others.len())].clone());
            }
            let rest: Vec<String> = rig.hosts.iter().filter(|o| !rack.contains(o)).cloned().collect();
            detail = json!({"ms": f.amount, "racks": [rack, rest]});
            rig.fault("latency", &[amount.clone(), rack.join(","), rest.join(",")])?;
        }
        Fault::Freeze => {
            rig.fault("freeze", &[node.to_string()])?;
            // Taken after the freezer answered: the span cut out is never longer than the freeze.
            h.frozen.push(Frozen { host: node.to_string(), from_ms: now_ms(), to_ms: None });
            h.paused.insert(node.to_string());
        }
        Fault::Crash => {
            rig.fault("crash", &[node.to_string()])?;
            h.down.insert(node.to_string());
        }
        Fault::Reboot => {
            let old = rig.instance(node);
            rig.fault("reboot", &[node.to_string()])?;
            // Waited for here: healing while the host is between two boots would boot it twice.
            rig.wait_up(node, old, REBOOT_BOUND)?;
        }
        Fault::SlowDisk => rig.fault("slow-disk", &[amount.clone(), node.to_string()])?,
        // hosts.sh reboots the host into its skewed clocks and waits for it.
        Fault::ClockSkew => rig.fault("skew", &[amount.clone(), node.to_string()])?,
        Fault::PowerOff => power_off(h)?,
        Fault::FailDisk => {
            let what = if f.amount == 0 { "write" } else { "all" };
            detail = json!(what);
            rig.fault("fail-disk", &[what.to_string(), node.to_string()])?;
        }
    }
    h.fault_event(f.fault.name(), node, detail);
    Ok(())
}

/// Every host's PID 1 killed at once.
pub(super) fn power_off(h: &mut Harness) -> anyhow::Result<()> {
    let rig = rig(h)?;
    rig.fault("poweroff-all", &[])?;
    h.down.extend(rig.hosts.iter().cloned());
    h.fault_event("poweroff-all", "all", json!(null));
    Ok(())
}

/// Ends `f` on `node`.
pub(super) fn heal(h: &mut Harness, f: &PlannedFault, node: &str) -> anyhow::Result<()> {
    let rig = rig(h)?;
    match f.fault {
        // systemd, or the host's reboot, brought the daemon back.
        Fault::Kill | Fault::Restart | Fault::Upgrade | Fault::Reboot | Fault::ClockSkew => return Ok(()),
        Fault::Pause => {
            signal_daemon(&rig, node, "SIGCONT")?;
            h.paused.remove(node);
        }
        Fault::Freeze => thaw(h, &rig, node)?,
        Fault::Crash | Fault::PowerOff => {
            rig.heal()?;
            for host in &rig.hosts {
                rig.wait_up(host, None, REBOOT_BOUND)?;
            }
            h.down.clear();
        }
        // hosts.sh heal also starts corrald again where its disk failed (it may have given up).
        Fault::Partition | Fault::Isolate | Fault::OneWay | Fault::Loss | Fault::Latency | Fault::SlowDisk | Fault::FailDisk => {
            rig.heal()?;
            h.partitioned.remove(node);
        }
    }
    h.fault_event(&format!("heal-{}", f.fault.name()), node, json!(null));
    Ok(())
}

fn thaw(h: &mut Harness, rig: &Rig, node: &str) -> anyhow::Result<()> {
    // Taken before the freezer is told: the span cut out is never longer than the freeze.
    let now = now_ms();
    for f in h.frozen.iter_mut().filter(|f| f.host == node && f.to_ms.is_none()) {
        f.to_ms = Some(now);
    }
    rig.fault("thaw", &[node.to_string()])?;
    h.paused.remove(node);
    Ok(())
}

/// Ends every fault: thaws, continues paused daemons, clears the network and disks, boots
/// every host that is down, and waits until each runs.
pub(super) fn heal_all(h: &mut Harness) -> anyhow::Result<()> {
    let rig = rig(h)?;
    for node in h.paused.clone() {
        if h.frozen.iter().any(|f| f.host == node && f.to_ms.is_none()) {
            thaw(h, &rig, &node)?;
        } else {
            signal_daemon(&rig, &node, "SIGCONT")?;
            h.paused.remove(&node);
        }
    }
    rig.heal()?;
    for host in &rig.hosts {
        rig.wait_up(host, None, REBOOT_BOUND)?;
    }
    h.down.clear();
    h.partitioned.clear();
    h.fault_event("heal-all", "all", json!(null));
    Ok(())
}
