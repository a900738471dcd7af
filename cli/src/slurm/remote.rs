//! `pdsh` and `ssh` inside a job. DeepSpeed's launcher and other tools written for a cluster
//! with passwordless ssh reach the job's other nodes this way.
//!
//! Corral links both into the job's `/job/bin`, first on its `PATH`. Each runs its command on the
//! job's nodes as a step: `srun --overlap`, which holds nothing and sees the job's GPUs there,
//! as `pam_slurm_adopt` puts an ssh session into the job. No ssh daemon is involved. `ssh` to a
//! host outside the job runs the system's ssh.

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};

use super::SlurmError;

/// pdsh's options that take a value, and those it takes alone.
const PDSH_VALUED: &[&str] = &["-w", "-x", "-f", "-R", "-l", "-u", "-t", "-g", "-X"];
const PDSH_FLAGS: &[&str] = &["-S", "-N", "-b", "-d", "-s", "-q"];
/// ssh's options that take a value, and those it takes alone.
const SSH_VALUED: &[&str] =
    &["-o", "-p", "-l", "-i", "-F", "-E", "-c", "-m", "-b", "-e", "-J", "-L", "-R", "-D", "-W", "-O", "-Q", "-S", "-B", "-w", "-I"];
const SSH_FLAGS: &[&str] = &[
    "-t", "-T", "-n", "-q", "-v", "-4", "-6", "-A", "-a", "-x", "-X", "-Y", "-C", "-N", "-f", "-G", "-K", "-k", "-M", "-s", "-g", "-y",
    "-P",
];

/// What `pdsh` was asked: hosts in order (duplicates dropped), whether to return the largest
/// exit code (`-S`), whether to prefix lines with the host (not `-N`), and the command.
#[derive(Debug, PartialEq, Eq)]
struct PdshArgs {
    hosts: Vec<String>,
    largest_exit: bool,
    prefix: bool,
    command: String,
}

fn parse_pdsh(args: &[String]) -> Result<PdshArgs, SlurmError> {
    let (mut hosts, mut excluded, mut largest_exit, mut prefix) = (Vec::new(), Vec::new(), false, true);
    let mut i = 0;
    while i < args.len() && args[i].starts_with('-') {
        let arg = args[i].as_str();
        if PDSH_FLAGS.contains(&arg) {
            largest_exit |= arg == "-S";
            prefix &= arg != "-N";
            i += 1;
            continue;
        }
        let (flag, inline) = if arg.len() > 2 { (&arg[..2], Some(&arg[2..])) } else { (arg, None) };
        if !PDSH_VALUED.contains(&flag) {
            return Err(SlurmError::fatal("pdsh", format!("option {arg} is not one Corral's pdsh takes (-w -x -S -N -f -R -l -u -t)")));
        }
        let value = match inline {
            Some(v) => v.to_string(),
            None => {
                i += 1;
                args.get(i).cloned().ok_or_else(|| SlurmError::fatal("pdsh", format!("option {flag} needs a value")))?
            }
        };
        match flag {
            "-w" => hosts.extend(expand(&value)?),
            "-x" => excluded.extend(expand(&value)?),
            "-R" if !["ssh", "exec", "rsh"].contains(&value.as_str()) => {
                return Err(SlurmError::fatal(
                    "pdsh",
                    format!("rcmd module {value}: Corral's pdsh reaches a job's nodes through its steps (ssh, exec)"),
                ))
            }
            "-l" if std::env::var("USER").is_ok_and(|u| u != value) => {
                return Err(SlurmError::fatal("pdsh", format!("-l {value}: a job's steps run as the job's user")))
            }
            _ => {}
        }
        i += 1;
    }
    let mut seen = std::collections::BTreeSet::new();
    hosts.retain(|h| !excluded.contains(h) && seen.insert(h.clone()));
    if hosts.is_empty() {
        return Err(SlurmError::fatal("pdsh", "no remote hosts specified (-w)"));
    }
    let command = args[i..].join(" ");
    if command.trim().is_empty() {
        return Err(SlurmError::fatal("pdsh", "no command (Corral's pdsh runs a command; it has no interactive mode)"));
    }
    Ok(PdshArgs { hosts, largest_exit, prefix, command })
}

fn expand(list: &str) -> Result<Vec<String>, SlurmError> {
    slurm_compat::hostlist::expand(list).map_err(|e| SlurmError::fatal("pdsh", format!("hosts {list}: {e}")))
}

/// pdsh's substitutions in a host's command: `%h` its name, `%n` its rank in the host list,
/// `%u` the user, `%%` a `%`.
fn substitute(command: &str, host: &str, rank: usize) -> String {
    let mut out = String::with_capacity(command.len());
    let mut chars = command.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, chars.peek()) {
            ('%', Some('h')) => out.push_str(host),
            ('%', Some('n')) => out.push_str(&rank.to_string()),
            ('%', Some('u')) => out.push_str(&std::env::var("USER").unwrap_or_default()),
            ('%', Some('%')) => out.push('%'),
            _ => {
                out.push(c);
                continue;
            }
        }
        chars.next();
    }
    out
}

/// `srun` as a child process: one step on `host` running `command` with `/bin/sh -c`.
fn step_on(host: &str, command: &str, pty: bool) -> Result<Command, SlurmError> {
    let exe = std::env::current_exe().map_err(|e| SlurmError::fatal("pdsh", format!("locate corral: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.args(["slurm", "srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist", host]);
    if pty {
        cmd.arg("--pty");
    }
    cmd.args(["/bin/sh", "-c", command]);
    Ok(cmd)
}

/// `pdsh [-S] [-N] [-f N] [-w HOSTS] [-x HOSTS] [-R ssh|exec] COMMAND...`: the command on each
/// host at once, each as its own step, output prefixed `HOST: ` line by line.
pub fn pdsh(args: &[String]) -> Result<i32, SlurmError> {
    let p = parse_pdsh(args)?;
    in_a_job("pdsh")?;
    let mut children = Vec::new();
    for (rank, host) in p.hosts.iter().enumerate() {
        let mut cmd = step_on(host, &substitute(&p.command, host, rank), false)?;
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| SlurmError::fatal("pdsh", format!("{host}: start a step: {e}")))?;
        let prefix = if p.prefix { format!("{host}: ") } else { String::new() };
        let out = child.stdout.take().map(|s| relay(s, prefix.clone(), false));
        let err = child.stderr.take().map(|s| relay(s, prefix, true));
        children.push((host.clone(), child, out, err));
    }
    let mut largest = 0;
    for (host, mut child, out, err) in children {
        let status = child.wait().map_err(|e| SlurmError::fatal("pdsh", format!("{host}: wait for its step: {e}")))?;
        for relay in [out, err].into_iter().flatten() {
            let _ = relay.join();
        }
        let code = status.code().unwrap_or(1);
        if code != 0 {
            eprintln!("pdsh@{}: {host}: ssh exited with exit code {code}", crate::slurm::host_name());
        }
        largest = largest.max(code);
    }
    Ok(if p.largest_exit { largest } else { 0 })
}

/// Copies a child's output line by line, each line after `prefix`.
fn relay(from: impl std::io::Read + Send + 'static, prefix: String, to_stderr: bool) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(from).split(b'\n').map_while(Result::ok) {
            let text = [prefix.as_bytes(), &line, b"\n"].concat();
            let _ = if to_stderr { std::io::stderr().write_all(&text) } else { std::io::stdout().write_all(&text) };
        }
    })
}

/// The job's nodes (`SLURM_JOB_NODELIST`), or why this is not inside a job.
fn in_a_job(prog: &str) -> Result<Vec<String>, SlurmError> {
    let list = std::env::var("SLURM_JOB_NODELIST")
        .map_err(|_| SlurmError::fatal(prog, "not inside a job: Corral's pdsh and ssh reach a job's nodes through its steps"))?;
    slurm_compat::hostlist::expand(&list).map_err(|e| SlurmError::fatal(prog, format!("SLURM_JOB_NODELIST {list}: {e}")))
}

/// `ssh [OPTIONS] [USER@]HOST [COMMAND...]`: to a node of this job, the command (or a login
/// shell at a terminal) as a step there; to any other host, the system's ssh, as asked.
pub fn ssh(args: &[String]) -> Result<i32, SlurmError> {
    let mut i = 0;
    while i < args.len() && args[i].starts_with('-') && args[i] != "--" {
        let flag = &args[i][..args[i].len().min(2)];
        i += if SSH_VALUED.contains(&flag) && args[i].len() == 2 {
            2
        } else if SSH_VALUED.contains(&flag) || SSH_FLAGS.iter().any(|f| args[i].starts_with(f)) {
            1
        } else {
            return system_ssh(args);
        };
    }
    i += usize::from(args.get(i).is_some_and(|a| a == "--"));
    let Some(target) = args.get(i) else { return system_ssh(args) };
    let host = target.rsplit('@').next().unwrap_or(target);
    let nodes = std::env::var("SLURM_JOB_NODELIST").ok().map(|_| in_a_job("ssh")).transpose()?.unwrap_or_default();
    if !nodes.iter().any(|n| n == host) {
        return system_ssh(args);
    }
    let command = args[i + 1..].join(" ");
    let interactive = command.trim().is_empty();
    let command = if interactive { "exec \"${SHELL:-/bin/sh}\" -l".to_string() } else { command };
    let mut cmd = step_on(host, &command, interactive)?;
    use std::os::unix::process::CommandExt;
    Err(SlurmError::fatal("ssh", format!("run a step on {host}: {}", cmd.exec())))
}

/// Runs the system's ssh (the first `ssh` on `PATH` that is not this program) with `args`.
fn system_ssh(args: &[String]) -> Result<i32, SlurmError> {
    let me = std::env::current_exe().ok().and_then(|p| p.canonicalize().ok());
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .map(|d| d.join("ssh"))
        .find(|p| p.is_file() && p.canonicalize().ok() != me)
        .ok_or_else(|| SlurmError::fatal("ssh", "not a host of this job, and no ssh is installed"))?;
    use std::os::unix::process::CommandExt;
    Err(SlurmError::fatal("ssh", format!("run {}: {}", found.display(), Command::new(&found).args(args).exec())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pdsh_takes_deepspeeds_command_line() {
        let p = parse_pdsh(&strings(&["-S", "-f", "1024", "-w", "n1,n2", "export A=1;", "cd /w;", "python", "--node_rank=%n"]))
            .unwrap_or_else(|e| panic!("{}", e.text));
        let command = "export A=1; cd /w; python --node_rank=%n".to_string();
        assert_eq!(p, PdshArgs { hosts: strings(&["n1", "n2"]), largest_exit: true, prefix: true, command });
        let p = parse_pdsh(&strings(&["-N", "-wgpu[1-3]", "-x", "gpu2", "hostname"])).map_err(|e| e.text);
        assert_eq!(p.map(|p| (p.hosts, p.prefix)), Ok((strings(&["gpu1", "gpu3"]), false)));
        assert!(parse_pdsh(&strings(&["-w", "n1", "-R", "rsh2", "true"])).is_err());
        assert!(parse_pdsh(&strings(&["-w", "n1"])).is_err(), "no command");
        assert!(parse_pdsh(&strings(&["true"])).is_err(), "no hosts");
        assert!(parse_pdsh(&strings(&["-z", "-w", "n1", "true"])).is_err(), "an option it does not know");
    }

    #[test]
    fn pdsh_substitutes_each_hosts_name_and_rank() {
        assert_eq!(substitute("launch --node_rank=%n on %h at 100%%", "n2", 1), "launch --node_rank=1 on n2 at 100%");
        assert_eq!(substitute("50% done", "n1", 0), "50% done");
    }
}
