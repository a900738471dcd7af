//! The eBPF device program in a real cgroup v2, with real processes: a process in a cgroup
//! whose program denies /dev/null's number cannot open it, and can open /dev/zero; a process
//! outside it is unaffected. Needs root and a writable cgroup v2 hierarchy; where either is
//! missing the test says why and checks that `probe` refuses rather than claim a fence.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use corral_node::run::cgroup::{cgroup2_mount, char_device, join_in_child, open_procs, own_cgroup};
use corral_node::run::cgroup_devices;

/// A fresh cgroup below this process's own v2 cgroup, or why there is none.
fn test_cgroup(name: &str) -> Result<PathBuf, String> {
    let mount = cgroup2_mount().ok_or("no cgroup v2 hierarchy is mounted")?;
    let own = own_cgroup().ok_or("no cgroup v2 path for this process")?;
    let dir = mount.join(own.trim_start_matches('/')).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    Ok(dir)
}

/// Runs `sh -c script` inside the cgroup at `dir` (joined before exec); true when it exits 0.
fn sh_in(dir: Option<&Path>, script: &str) -> bool {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script]);
    if let Some(dir) = dir {
        let procs = open_procs(dir).expect("open cgroup.procs");
        let fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
        // SAFETY: join_in_child only calls getpid and write.
        unsafe { cmd.pre_exec(move || join_in_child(fd)) };
        let ok = cmd.status().expect("run sh").success();
        drop(procs);
        return ok;
    }
    cmd.status().expect("run sh").success()
}

#[test]
fn a_device_program_fences_the_devices_it_denies_for_processes_in_its_cgroup() {
    let null = char_device(Path::new("/dev/null")).expect("/dev/null is a character device");
    let dir = match test_cgroup("corral-devices-test") {
        Ok(d) => d,
        Err(why) => {
            eprintln!("no writable cgroup v2 here ({why}): checking that nothing is claimed");
            let tmp = std::env::temp_dir().join(format!("not-a-cgroup-{}", std::process::id()));
            assert!(cgroup_devices::probe(&tmp).is_err());
            return;
        }
    };
    let base = dir.parent().expect("parent").to_path_buf();
    let probed = cgroup_devices::probe(&base);
    if let Err(e) = &probed {
        // Not root, or no BPF here: the node would then say "not fenced" at start.
        eprintln!("device programs cannot be loaded here: {e}");
        assert!(cgroup_devices::attach(&dir, &[null]).is_err());
        std::fs::remove_dir(&dir).expect("remove test cgroup");
        return;
    }
    cgroup_devices::attach(&dir, &[null]).expect("attach a program denying /dev/null");
    let denied = sh_in(Some(&dir), "echo x > /dev/null");
    let other = sh_in(Some(&dir), "head -c 1 /dev/zero > /dev/zero");
    let outside = sh_in(None, "echo x > /dev/null");
    std::fs::remove_dir(&dir).expect("remove test cgroup");
    assert!(!denied, "a process in the cgroup opened a denied device");
    assert!(other, "a process in the cgroup could not open a device not denied");
    assert!(outside, "a process outside the cgroup was fenced");
}
