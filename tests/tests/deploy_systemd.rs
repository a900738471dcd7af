//! Bare-metal deployment pieces: `deploy/install.sh` into a staging root, and the installed
//! systemd unit checked by `systemd-analyze verify` (package `systemd` on Debian).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use corral_tests::bin_dir;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests crate sits in the workspace").to_path_buf()
}

fn install(env: &[(&str, &Path)], extra: &[&str]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("deploy/install.sh")).arg("--bin-dir").arg(bin_dir()).args(extra);
    for var in ["DESTDIR", "PREFIX", "SYSCONFDIR", "LOCALSTATEDIR", "UNITDIR", "CORRAL_USER"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run deploy/install.sh")
}

fn text(out: &Output) -> String {
    format!("status {:?}\nstdout:\n{}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display())).permissions().mode() & 0o7777
}

#[test]
fn install_sh_stages_binaries_shims_unit_and_directories() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let stage = tmp.path().join("stage");
    let prefix = Path::new("/opt/corral");
    for round in 0..2 {
        // The second run checks that installing again over an installation works.
        let out = install(&[("DESTDIR", &stage), ("PREFIX", prefix)], &["--no-user"]);
        assert!(out.status.success(), "install round {round} failed: {}", text(&out));
    }
    let staged = |p: &str| stage.join(p.trim_start_matches('/'));
    for bin in ["corrald", "corral"] {
        let path = staged(&format!("/opt/corral/bin/{bin}"));
        assert_eq!(mode(&path), 0o755, "{}", path.display());
        let built = std::fs::metadata(bin_dir().join(bin)).expect("stat built binary").len();
        assert_eq!(std::fs::metadata(&path).expect("stat installed binary").len(), built, "{bin} is not the built one");
    }
    for shim in ["sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol", "sacct"] {
        let link = staged(&format!("/opt/corral/libexec/corral/slurm/{shim}"));
        let target = std::fs::read_link(&link).unwrap_or_else(|e| panic!("{} is not a symlink: {e}", link.display()));
        assert_eq!(target, Path::new("/opt/corral/bin/corral"), "{shim} must point at the installed (not the staged) corral");
    }
    let unit_path = staged("/etc/systemd/system/corrald.service");
    assert_eq!(mode(&unit_path), 0o644);
    let unit = std::fs::read_to_string(&unit_path).expect("read installed unit");
    for line in [
        "Type=notify",
        "ExecStart=/opt/corral/bin/corrald --config /etc/corral/node.toml",
        "ConditionPathExists=/etc/corral/node.toml",
        "Restart=on-failure",
        "KillMode=process",
        "RestartForceExitStatus=75",
        "User=root",
        "CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_KILL CAP_DAC_READ_SEARCH CAP_CHOWN CAP_SYS_ADMIN",
        "RuntimeDirectory=corral",
        "Documentation=file:///opt/corral/share/doc/corral/README.md",
    ] {
        assert!(unit.lines().any(|l| l == line), "installed unit lacks '{line}':\n{unit}");
    }
    let restd = std::fs::read_to_string(staged("/etc/systemd/system/corral-restd.service")).expect("read installed restd unit");
    for line in
        ["ExecStart=/opt/corral/bin/corral restd --node-config /etc/corral/node.toml --listen 0.0.0.0:6820", "Requires=corrald.service"]
    {
        assert!(restd.lines().any(|l| l == line), "installed restd unit lacks '{line}':\n{restd}");
    }
    for dir in ["/etc/corral", "/var/lib/corral", "/var/log/corral"] {
        assert!(staged(dir).is_dir(), "{dir} not made");
        assert_eq!(mode(&staged(dir)), 0o750, "{dir}");
    }
    for doc in ["README.md", "examples/node-first.toml", "examples/node-join.toml", "examples/client.toml"] {
        assert!(staged(&format!("/opt/corral/share/doc/corral/{doc}")).is_file(), "{doc} not installed");
    }
    // The staged corral runs and knows the cluster set-up commands.
    let help = Command::new(staged("/opt/corral/bin/corral")).args(["cluster", "--help"]).output().expect("run staged corral");
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("init"), "{}", text(&help));
}

#[test]
fn install_sh_refuses_bad_input() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = install(&[("DESTDIR", tmp.path())], &["--frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let out = install(&[("DESTDIR", tmp.path()), ("PREFIX", Path::new("relative/path"))], &["--no-user"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absolute"), "{}", text(&out));
    // A later --bin-dir wins over the one `install` passes.
    let out = install(&[("DESTDIR", tmp.path())], &["--bin-dir", "/nonexistent", "--no-user"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not found"), "{}", text(&out));
}

/// Lines of `systemd-analyze verify UNIT` output that are about the unit itself (it also
/// reports on units it pulls in, which are the host's business).
fn verify(unit: &Path) -> Option<(Output, Vec<String>)> {
    let out = match Command::new("systemd-analyze").arg("verify").arg(unit).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("run systemd-analyze: {e}"),
    };
    let name = unit.file_name().expect("unit file name").to_string_lossy().into_owned();
    let complaints = String::from_utf8_lossy(&out.stderr)
        .lines()
        .chain(String::from_utf8_lossy(&out.stdout).lines())
        .filter(|l| l.contains(&name))
        .map(str::to_string)
        .collect();
    Some((out, complaints))
}

#[test]
fn installed_unit_passes_systemd_analyze_verify() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Installed for real (no DESTDIR) under a temporary prefix: ExecStart names a binary that
    // exists, which verify checks.
    let prefix = tmp.path().join("prefix");
    let units = tmp.path().join("units");
    let out = install(
        &[("PREFIX", &prefix), ("SYSCONFDIR", &tmp.path().join("etc")), ("LOCALSTATEDIR", &tmp.path().join("var")), ("UNITDIR", &units)],
        &["--no-user", "--no-systemctl"],
    );
    assert!(out.status.success(), "install failed: {}", text(&out));
    let unit = units.join("corrald.service");
    let unit_text = std::fs::read_to_string(&unit).expect("read unit");
    assert!(unit_text.contains(&format!("ExecStart={}/bin/corrald --config", prefix.display())), "{unit_text}");

    let Some((out, complaints)) = verify(&unit) else {
        eprintln!("SKIPPED: systemd-analyze is not installed (Debian package `systemd`); the unit was not verified");
        return;
    };
    assert!(out.status.success() && complaints.is_empty(), "systemd-analyze verify refused the unit: {}", text(&out));
    let (out, complaints) = verify(&units.join("corral-restd.service")).expect("systemd-analyze ran a moment ago");
    assert!(out.status.success() && complaints.is_empty(), "systemd-analyze verify refused the restd unit: {}", text(&out));

    // verify exits 0 on unknown keys and bad values, so the check above relies on its
    // messages: make sure a broken unit does produce them.
    let broken = tmp.path().join("broken-corrald.service");
    std::fs::write(&broken, unit_text.replace("ProtectSystem=full", "ProtectSystem=fuller\nNoSuchKey=1")).expect("write broken unit");
    let (out, complaints) = verify(&broken).expect("systemd-analyze ran a moment ago");
    assert!(complaints.len() >= 2, "a broken unit went unnoticed: {}", text(&out));
}
