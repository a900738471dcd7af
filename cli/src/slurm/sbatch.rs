//! `sbatch`: `#SBATCH` directives, overridden by `SBATCH_*` variables, overridden by the
//! command line, turned into a [`JobSpec`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use proto::{ArraySpec, ClientRequest, Dependency, GresKind, GresRequest, JobSpec, Reply};

use super::env::extra;
use super::opts::{self, Arg, Parsed};
pub use super::sbatch_options::{INPUT_ENV, OPTIONS};
use super::sbatch_options::{KEPT_IN_EXTRA, SHOWN_FROM_EXTRA};
use super::{hostlist, time, SlurmError};

use super::values::{corral_option, node_and_task_counts, parse_constraint, parse_gpu_count, parse_nodes, parse_switches};
pub use super::values::{
    parse_array, parse_dependencies, parse_gres, parse_int, parse_mem_mib, parse_signal, parse_signal_name, ARRAY_TASK_ID_MAX,
};

pub const PROG: &str = "sbatch";

/// What sbatch runs in: the parts of the process a submission reads, so tests can supply them.
#[derive(Clone, Debug)]
pub struct Context {
    pub cwd: PathBuf,
    pub env: BTreeMap<String, String>,
    pub user: String,
    pub host: String,
    pub now_s: i64,
}

impl Context {
    pub fn current() -> Result<Context, SlurmError> {
        Ok(Context {
            cwd: std::env::current_dir().map_err(|e| SlurmError::fatal(PROG, format!("getcwd failed: {e}")))?,
            env: std::env::vars().collect(),
            user: super::current_user(),
            host: super::host_name(),
            now_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64),
        })
    }
}

/// Where the batch script comes from.
pub enum ScriptSource<'a> {
    /// Read this file (relative to the context's cwd).
    File,
    /// The script text given directly (stdin or a test).
    Text(&'a str),
}

/// The outcome of sbatch's option processing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Submission {
    pub spec: JobSpec,
    pub parsable: bool,
    pub wait: bool,
    pub quiet: bool,
    pub test_only: bool,
    /// Lines for stderr before submitting: the options accepted but without effect in Corral
    /// (kept with the job, never silently dropped).
    pub warnings: Vec<String>,
}

/// What to do for a command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Submit(Box<Submission>),
    /// Print this text to stdout and exit 0 (`--help`, `--usage`, `--version`).
    Print(String),
}

pub use super::directives::directives;

/// Options that `SBATCH_*` variables of `env` set, in [`INPUT_ENV`] order.
pub fn env_options(env: &BTreeMap<String, String>) -> Vec<(&'static str, Option<String>)> {
    let mut out = Vec::new();
    for (var, name) in INPUT_ENV {
        let Some(value) = env.get(*var) else { continue };
        let Some(def) = OPTIONS.iter().find(|d| d.long == *name) else {
            continue;
        };
        match def.arg {
            Arg::No => {
                let v = value.trim();
                let on = v.is_empty() || v.eq_ignore_ascii_case("yes") || v.parse::<i64>().is_ok_and(|n| n != 0);
                if on {
                    out.push((def.long, None));
                }
            }
            Arg::Optional => out.push((def.long, (!value.is_empty()).then(|| value.clone()))),
            Arg::Required => out.push((def.long, Some(value.clone()))),
        }
    }
    out
}

/// Processes sbatch's command line: reads the script, applies its directives, then the
/// `SBATCH_*` variables, then the command line, each overriding the one before.
pub fn parse(args: &[String], ctx: &Context, source: ScriptSource<'_>) -> Result<Action, SlurmError> {
    let cli = opts::parse(PROG, OPTIONS, args, true)?;
    if cli.has("help") || cli.has("usage") {
        return Ok(Action::Print(usage()));
    }
    if cli.has("version") {
        return Ok(Action::Print(format!("slurm {}\n", super::SLURM_VERSION)));
    }
    // The script: --wrap, a file, or stdin.
    let wrap = cli.last("wrap").map(str::to_string);
    let (script, script_args, default_name) = if let Some(cmd) = &wrap {
        if !cli.operands.is_empty() {
            return Err(SlurmError::fatal(PROG, "Script arguments not permitted with --wrap option"));
        }
        (format!("#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{cmd}\n"), Vec::new(), "wrap".to_string())
    } else {
        match (&source, cli.operands.split_first()) {
            (ScriptSource::Text(text), first) => {
                let name = first.map(|(f, _)| file_name(f)).unwrap_or_else(|| "sbatch".to_string());
                let rest = first.map(|(_, r)| r.to_vec()).unwrap_or_default();
                (text.to_string(), rest, name)
            }
            (ScriptSource::File, Some((file, rest))) => {
                let path = ctx.cwd.join(file);
                let text = std::fs::read(&path).map_err(|_| SlurmError::fatal(PROG, format!("Unable to open file {file}")))?;
                if text.is_empty() {
                    return Err(SlurmError::fatal(PROG, "Batch script is empty!"));
                }
                let text =
                    String::from_utf8(text).map_err(|_| SlurmError::fatal(PROG, "Batch script contains DOS line breaks (\\r\\n)"))?;
                (text, rest.to_vec(), file_name(file))
            }
            (ScriptSource::File, None) => return Err(SlurmError::fatal(PROG, "no batch script given and standard input is a terminal")),
        }
    };
    check_script(&script)?;

    let from_script = opts::parse(PROG, OPTIONS, &directives(&script, "#SBATCH"), true)?;
    if let Some(first) = from_script.operands.first() {
        return Err(SlurmError::fatal(PROG, format!("Invalid directive found in batch script: {first}")));
    }
    let mut all = Parsed::default();
    all.opts.extend(from_script.opts);
    all.opts.extend(env_options(&ctx.env));
    all.opts.extend(cli.opts);

    let mut b = Builder::new(PROG, ctx);
    for (name, value) in &all.opts {
        b.apply(name, value.as_deref())?;
    }
    let mut submission = b.finish(Some(script), script_args, default_name)?;
    // Slurm's model: the script runs on the first node; `srun` in it starts steps on all.
    submission.spec.set_batch(true);
    Ok(Action::Submit(Box::new(submission)))
}

fn file_name(path: &str) -> String {
    Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.to_string())
}

/// Slurm refuses scripts without an interpreter line and with DOS line breaks.
pub fn check_script(script: &str) -> Result<(), SlurmError> {
    if !script.starts_with("#!") {
        return Err(SlurmError::fatal_lines(
            PROG,
            &[
                "This does not look like a batch script.  The first",
                "line must start with #! followed by the path to an interpreter.",
                "For instance: #!/bin/sh",
            ],
        ));
    }
    if script.contains("\r\n") {
        return Err(SlurmError::fatal(PROG, "Batch script contains DOS line breaks (\\r\\n)"));
    }
    Ok(())
}

fn usage() -> String {
    "Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]\n\
     \n\
     Corral implements sbatch's options: -J -p -N -n -c --ntasks-per-node --mem --mem-per-cpu\n\
     --mem-per-gpu -t -o -e --open-mode --gres --gpus -G --gpus-per-node --gpus-per-task\n\
     --cpus-per-gpu -a --requeue --no-requeue --signal --exclusive -A -q -C -d -w -x -D --export\n\
     --begin -H --wait --parsable --wrap; others are recorded with the job, with a warning.\n"
        .to_string()
}

/// A memory size of zero is Slurm's "all of the node's memory", which Corral does not give: it
/// is refused rather than taken for an ordinary size.
fn positive_mem(mib: u64, option: &str, fatal: &dyn Fn(&str) -> SlurmError) -> Result<u64, SlurmError> {
    if mib == 0 {
        return Err(fatal(&format!("{option}=0 (all of each node's memory) is not supported: ask for a size")));
    }
    Ok(mib)
}

/// Host names of `-w`/`-x`: a host list, or a file of names when it holds a `/`.
fn parse_hosts(prog: &str, text: &str, cwd: &Path) -> Result<Vec<String>, SlurmError> {
    let bad = || SlurmError::fatal(prog, "Batch job submission failed: Invalid node name specified");
    if text.contains('/') {
        let body = std::fs::read_to_string(cwd.join(text)).map_err(|_| bad())?;
        let joined = body.split_whitespace().collect::<Vec<_>>().join(",");
        return hostlist::expand(&joined).map_err(|_| bad());
    }
    hostlist::expand(text).map_err(|_| bad())
}

/// Applies options one by one, checking each as Slurm does (so a bad `#SBATCH` value is an
/// error even when the command line overrides it).
pub struct Builder<'a> {
    prog: &'static str,
    ctx: &'a Context,
    name: Option<String>,
    partition: Option<String>,
    nodes: Option<(u32, u32)>,
    ntasks: Option<u32>,
    ntasks_per_node: Option<u32>,
    cpus_per_task: Option<u32>,
    mem_mib: Option<u64>,
    mem_per_cpu_mib: Option<u64>,
    mem_per_gpu_mib: Option<u64>,
    time_limit_s: Option<Option<u64>>,
    output: Option<String>,
    error: Option<String>,
    open_append: bool,
    gres: Option<GresRequest>,
    gpus: Option<(Option<String>, u32, String)>,
    gpus_per_node: Option<(Option<String>, u32, String)>,
    gpus_per_task: Option<(Option<String>, u32, String)>,
    cpus_per_gpu: Option<u32>,
    array: Option<(ArraySpec, String)>,
    requeue: bool,
    /// `--no-requeue` given (not only `--requeue` absent): `scontrol requeue` is refused.
    no_requeue: bool,
    signal: Option<proto::SignalSpec>,
    exclusive: bool,
    account: Option<String>,
    qos: Option<String>,
    constraint: Vec<String>,
    dependencies: Vec<Dependency>,
    nodelist: Vec<String>,
    exclude: Vec<String>,
    chdir: Option<PathBuf>,
    export: Option<String>,
    begin_s: Option<i64>,
    hold: bool,
    switches: Option<(u32, u64)>,
    wait: bool,
    parsable: bool,
    quiet: bool,
    test_only: bool,
    extra: BTreeMap<String, String>,
    /// One line per option accepted without effect, for stderr (`Submission::warnings`).
    warnings: Vec<String>,
}

impl<'a> Builder<'a> {
    pub fn new(prog: &'static str, ctx: &'a Context) -> Builder<'a> {
        Builder {
            prog,
            ctx,
            name: None,
            partition: None,
            nodes: None,
            ntasks: None,
            ntasks_per_node: None,
            cpus_per_task: None,
            mem_mib: None,
            mem_per_cpu_mib: None,
            mem_per_gpu_mib: None,
            time_limit_s: None,
            output: None,
            error: None,
            open_append: false,
            gres: None,
            gpus: None,
            gpus_per_node: None,
            gpus_per_task: None,
            cpus_per_gpu: None,
            array: None,
            requeue: false,
            no_requeue: false,
            signal: None,
            exclusive: false,
            account: None,
            qos: None,
            constraint: Vec::new(),
            dependencies: Vec::new(),
            nodelist: Vec::new(),
            exclude: Vec::new(),
            chdir: None,
            export: None,
            begin_s: None,
            hold: false,
            switches: None,
            wait: false,
            parsable: false,
            quiet: false,
            test_only: false,
            extra: BTreeMap::new(),
            warnings: Vec::new(),
        }
    }

    /// Applies one option (by long name); options the builder does not know are refused.
    pub fn apply(&mut self, name: &str, value: Option<&str>) -> Result<(), SlurmError> {
        if self.apply_counts(name, value)?
            || self.apply_memory(name, value)?
            || self.apply_io(name, value)?
            || self.apply_placement(name, value)?
            || self.apply_scheduling(name, value)?
        {
            return Ok(());
        }
        let v = value.unwrap_or("");
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        match name {
            "wait" => self.wait = true,
            "parsable" => self.parsable = true,
            "quiet" => self.quiet = true,
            "test-only" => self.test_only = true,
            "verbose" | "wrap" | "help" | "usage" | "version" => {}
            "uid" | "gid" => return Err(fatal(&format!("--{name} is only for root and not supported by Corral"))),
            // Read by the scheduler: `JobSpec::nice` lowers the job's priority, `JobSpec::reservation`
            // (`proto::SPEC_EXTRA_RESERVATION`) is where it may run.
            "nice" | "reservation" => {
                self.extra.insert(name.into(), v.to_string());
            }
            // Slurm refuses these where nothing is configured for them, as Corral has nothing.
            "licenses" => return Err(fatal(&format!("Invalid license specification: {v} (Corral has no licenses)"))),
            "priority" => {
                return Err(fatal(
                    "--priority is not supported by Corral (an operator's setting in Slurm); --nice=N lowers a job's priority",
                ))
            }
            other if KEPT_IN_EXTRA.contains(&other) => {
                self.extra.insert(other.to_string(), v.to_string());
                if !SHOWN_FROM_EXTRA.contains(&other) {
                    self.warnings.push(format!("{prog}: warning: --{other} has no effect in Corral; it is kept with the job"));
                }
            }
            other => return Err(fatal(&format!("option --{other} is not supported"))),
        }
        Ok(())
    }

    /// Applies a count option (nodes, tasks, CPUs, GPUs); false when `name` is not one.
    fn apply_counts(&mut self, name: &str, value: Option<&str>) -> Result<bool, SlurmError> {
        let v = value.unwrap_or("");
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        match name {
            "nodes" => {
                let (min, max) = parse_nodes(v).map_err(|m| fatal(&m))?;
                self.nodes = Some((min, max));
            }
            "ntasks" => self.ntasks = Some(parse_int(self.prog, "--ntasks", v)?),
            "ntasks-per-node" => self.ntasks_per_node = Some(parse_int(self.prog, "--ntasks-per-node", v)?),
            "cpus-per-task" => self.cpus_per_task = Some(parse_int(self.prog, "--cpus-per-task", v)?),
            "cpus-per-gpu" => self.cpus_per_gpu = Some(parse_int(self.prog, "--cpus-per-gpu", v)?),
            "gres" => self.gres = parse_gres(v).map_err(|m| fatal(&m))?,
            "gpus" | "gpus-per-node" | "gpus-per-task" => {
                let (ty, n) = parse_gpu_count(v)
                    .ok_or_else(|| fatal("Batch job submission failed: Invalid generic resource (gres) specification"))?;
                let slot = match name {
                    "gpus" => &mut self.gpus,
                    "gpus-per-node" => &mut self.gpus_per_node,
                    _ => &mut self.gpus_per_task,
                };
                *slot = Some((ty, n, v.to_string()));
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies `--mem`, `--mem-per-cpu` or `--mem-per-gpu` (the last one given wins); false
    /// when `name` is none of them.
    fn apply_memory(&mut self, name: &str, value: Option<&str>) -> Result<bool, SlurmError> {
        let v = value.unwrap_or("");
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        match name {
            "mem" => {
                self.mem_mib = Some(positive_mem(parse_mem_mib(v).ok_or_else(|| fatal("Invalid --mem specification"))?, "--mem", &fatal)?);
                self.mem_per_cpu_mib = None;
                self.mem_per_gpu_mib = None;
            }
            "mem-per-cpu" => {
                let per_cpu = parse_mem_mib(v).ok_or_else(|| fatal("Invalid --mem-per-cpu specification"))?;
                self.mem_per_cpu_mib = Some(positive_mem(per_cpu, "--mem-per-cpu", &fatal)?);
                self.mem_mib = None;
                self.mem_per_gpu_mib = None;
            }
            "mem-per-gpu" => {
                let per_gpu = parse_mem_mib(v).ok_or_else(|| fatal("Invalid --mem-per-gpu specification"))?;
                self.mem_per_gpu_mib = Some(positive_mem(per_gpu, "--mem-per-gpu", &fatal)?);
                self.mem_mib = None;
                self.mem_per_cpu_mib = None;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies an option of the job's name, files, directory or environment; false when `name`
    /// is not one.
    fn apply_io(&mut self, name: &str, value: Option<&str>) -> Result<bool, SlurmError> {
        let v = value.unwrap_or("");
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        match name {
            "job-name" => self.name = Some(v.to_string()),
            "output" => self.output = Some(v.to_string()),
            "error" => self.error = Some(v.to_string()),
            "open-mode" => {
                self.open_append = match v.chars().next() {
                    Some('a' | 'A') => true,
                    Some('t' | 'T') => false,
                    _ => return Err(fatal("Invalid --open-mode specification")),
                }
            }
            "chdir" => self.chdir = Some(self.ctx.cwd.join(v)),
            "export" => self.export = Some(v.to_string()),
            "export-file" => return Err(fatal("--export-file is not supported yet")),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies an option of where the job may run (partition, account, QOS, features, hosts,
    /// exclusivity, switches); false when `name` is not one.
    fn apply_placement(&mut self, name: &str, value: Option<&str>) -> Result<bool, SlurmError> {
        let v = value.unwrap_or("");
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        match name {
            "partition" => self.partition = Some(v.to_string()),
            "account" => self.account = Some(v.to_string()),
            "qos" => self.qos = Some(v.to_string()),
            "constraint" => {
                self.constraint = parse_constraint(v).ok_or_else(|| fatal("Batch job submission failed: Invalid feature specification"))?;
            }
            "nodelist" => self.nodelist = parse_hosts(self.prog, v, &self.ctx.cwd)?,
            "nodefile" => self.nodelist = parse_hosts(self.prog, &format!("./{}", v.trim_start_matches("./")), &self.ctx.cwd)?,
            "exclude" => self.exclude = parse_hosts(self.prog, v, &self.ctx.cwd)?,
            "exclusive" => match value {
                None | Some("user") | Some("mcs") => {
                    self.exclusive = true;
                    if let Some(mode) = value {
                        self.extra.insert("exclusive".into(), mode.to_string());
                    }
                }
                Some(_) => return Err(fatal("Invalid --exclusive specification")),
            },
            "switches" => self.switches = Some(parse_switches(v).ok_or_else(|| fatal("Invalid --switches specification"))?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Applies an option of when and how often the job runs (time limit, array, requeue,
    /// signal, dependencies, begin time, hold); false when `name` is not one.
    fn apply_scheduling(&mut self, name: &str, value: Option<&str>) -> Result<bool, SlurmError> {
        let v = value.unwrap_or("");
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        match name {
            "time" => self.time_limit_s = Some(time::parse_limit_s(v).map_err(|time::NotATime| fatal("Invalid --time specification"))?),
            "array" => {
                let spec = parse_array(v).ok_or_else(|| fatal("invalid --array specification"))?;
                self.array = Some((spec, v.to_string()));
            }
            "requeue" => (self.requeue, self.no_requeue) = (true, false),
            "no-requeue" => (self.requeue, self.no_requeue) = (false, true),
            "signal" => self.signal = Some(parse_signal(v).ok_or_else(|| fatal("Invalid --signal specification"))?),
            "dependency" => {
                self.dependencies = parse_dependencies(v).ok_or_else(|| fatal("Batch job submission failed: Job dependency problem"))?;
            }
            "begin" => self.begin_s = Some(time::parse_point(v, self.ctx.now_s).ok_or_else(|| fatal("Invalid --begin specification"))?),
            "hold" => self.hold = true,
            _ if corral_option(prog, name, v, &mut self.extra)? => {}
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The job: a batch `script` run with `args`, or (no script) the command `args`.
    pub fn finish(mut self, script: Option<String>, args: Vec<String>, default_name: String) -> Result<Submission, SlurmError> {
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        let ctx = self.ctx;
        let (nodes, nodes_max, tasks_per_node) = self.node_and_task_counts();
        let gres = self.gres_per_node(nodes, nodes_max, tasks_per_node)?;
        let gpus_per_node = gres.as_ref().filter(|g| g.kind == GresKind::Gpu).map_or(0, |g| g.count);
        let cpus_per_task = self.cpus_per_task_with_gpus(gpus_per_node, tasks_per_node)?;
        let mem_mib = self.mem_per_node_mib(cpus_per_task, tasks_per_node, gpus_per_node)?;
        let workdir = self.chdir.clone().unwrap_or_else(|| ctx.cwd.clone());
        let env = export_env(self.export.as_deref().unwrap_or("ALL"), &ctx.env);
        let output =
            self.output.clone().unwrap_or_else(|| if self.array.is_some() { "slurm-%A_%a.out".into() } else { "slurm-%j.out".into() });
        self.extra.insert(extra::SUBMIT_DIR.into(), ctx.cwd.display().to_string());
        if let Some((_, text)) = &self.array {
            self.extra.insert(extra::ARRAY.into(), text.clone());
        }
        if let Some(e) = &self.export {
            self.extra.insert("export".into(), e.clone());
        }
        let mut spec = JobSpec::command(args, &workdir.display().to_string(), &ctx.user);
        spec.name = self.name.clone().filter(|n| !n.is_empty()).unwrap_or(default_name);
        spec.script = script;
        spec.gres = gres;
        spec.cpus_per_task = cpus_per_task;
        spec.mem_mib = mem_mib;
        spec.time_limit_ms = self.time_limit_s.flatten().map(|s| s.saturating_mul(1000));
        spec.env = env;
        spec.output = Some(output);
        spec.nodes = nodes;
        spec.ntasks_per_node = tasks_per_node;
        self.copy_options_into(&mut spec);
        spec.set_nodes_max(nodes_max);
        spec.validate().map_err(|e| fatal(&format!("Batch job submission failed: {e}")))?;
        let warnings = std::mem::take(&mut self.warnings);
        Ok(Submission { spec, parsable: self.parsable, wait: self.wait, quiet: self.quiet, test_only: self.test_only, warnings })
    }

    /// The job's least and most nodes and its tasks per node ([`node_and_task_counts`]), noting
    /// a node range and a task total in `extra`.
    fn node_and_task_counts(&mut self) -> (u32, u32, u32) {
        let (nodes_min, nodes_max) = self.nodes.unwrap_or((1, 1));
        if nodes_min != nodes_max {
            self.extra.insert(extra::NODES_RANGE.into(), format!("{nodes_min}-{nodes_max}"));
        }
        if let Some(total) = self.ntasks {
            self.extra.insert(extra::NTASKS.into(), total.to_string());
        }
        node_and_task_counts((nodes_min, nodes_max), self.ntasks, self.ntasks_per_node)
    }

    /// GPUs per node, from whichever form was used (`--gres` first, as Slurm merges them),
    /// noting the form given in `extra`; `--gpus` must spread evenly over the `nodes`.
    fn gres_per_node(&mut self, nodes: u32, nodes_max: u32, tasks_per_node: u32) -> Result<Option<GresRequest>, SlurmError> {
        let prog = self.prog;
        let fatal = |msg: &str| SlurmError::fatal(prog, msg);
        let gres = if let Some(g) = self.gres.clone() {
            Some(g)
        } else if let Some((ty, n, text)) = &self.gpus_per_node {
            self.extra.insert(extra::GPUS_PER_NODE.into(), text.clone());
            Some(GresRequest { gpu_type: ty.clone(), count: *n, ..Default::default() })
        } else if let Some((ty, n, text)) = &self.gpus_per_task {
            self.extra.insert(extra::GPUS_PER_TASK.into(), text.clone());
            Some(GresRequest { gpu_type: ty.clone(), count: n.saturating_mul(tasks_per_node), ..Default::default() })
        } else if let Some((ty, n, text)) = &self.gpus {
            self.extra.insert(extra::GPUS.into(), text.clone());
            if nodes_max > nodes {
                return Err(fatal(&format!("--gpus={text} cannot be spread over a node range ({nodes}-{nodes_max} nodes); Corral allocates GPUs per node (use --gpus-per-node)")));
            }
            if n % nodes != 0 {
                return Err(fatal(&format!(
                    "--gpus={text} cannot be spread evenly over {nodes} nodes; Corral allocates GPUs per node (use --gpus-per-node)"
                )));
            }
            Some(GresRequest { gpu_type: ty.clone(), count: n / nodes, ..Default::default() })
        } else {
            None
        };
        Ok(gres)
    }

    /// CPUs per task: `--cpus-per-task` (1 by default), raised to cover `--cpus-per-gpu` for
    /// the node's `gpus_per_node` shared by its `tasks_per_node`; both are noted in `extra`.
    fn cpus_per_task_with_gpus(&mut self, gpus_per_node: u32, tasks_per_node: u32) -> Result<u32, SlurmError> {
        let mut cpus_per_task = self.cpus_per_task.unwrap_or(1);
        if self.cpus_per_task.is_some() {
            self.extra.insert(extra::CPUS_PER_TASK.into(), cpus_per_task.to_string());
        }
        if let Some(per_gpu) = self.cpus_per_gpu {
            self.extra.insert(extra::CPUS_PER_GPU.into(), per_gpu.to_string());
            if gpus_per_node == 0 {
                return Err(SlurmError::fatal(self.prog, "--cpus-per-gpu is set but no GPUs were requested"));
            }
            let wanted = per_gpu.saturating_mul(gpus_per_node).div_ceil(tasks_per_node);
            cpus_per_task = cpus_per_task.max(wanted);
        }
        Ok(cpus_per_task)
    }

    /// Memory per node in MiB from `--mem`, `--mem-per-cpu` or `--mem-per-gpu` (0: the
    /// cluster's default), noting a per-CPU or per-GPU size in `extra`.
    fn mem_per_node_mib(&mut self, cpus_per_task: u32, tasks_per_node: u32, gpus_per_node: u32) -> Result<u64, SlurmError> {
        let mem_mib = if let Some(m) = self.mem_mib {
            m
        } else if let Some(per_cpu) = self.mem_per_cpu_mib {
            self.extra.insert(extra::MEM_PER_CPU.into(), per_cpu.to_string());
            per_cpu.saturating_mul(u64::from(cpus_per_task) * u64::from(tasks_per_node))
        } else if let Some(per_gpu) = self.mem_per_gpu_mib {
            self.extra.insert(extra::MEM_PER_GPU.into(), per_gpu.to_string());
            if gpus_per_node == 0 {
                return Err(SlurmError::fatal(self.prog, "--mem-per-gpu is set but no GPUs were requested"));
            }
            per_gpu.saturating_mul(u64::from(gpus_per_node))
        } else {
            // Not asked: the cluster's default (`JobSpec::default_mem_mib`), as slurmctld's.
            0
        };
        Ok(mem_mib)
    }

    /// Copies the options that go into the job as given into `spec`, and moves `extra` there.
    fn copy_options_into(&mut self, spec: &mut JobSpec) {
        spec.error = self.error.clone();
        spec.requeue = self.requeue;
        spec.partition = self.partition.clone();
        spec.account = self.account.clone();
        spec.qos = self.qos.clone();
        spec.constraint = self.constraint.clone();
        spec.nodelist = self.nodelist.clone();
        spec.exclude = self.exclude.clone();
        spec.exclusive = self.exclusive;
        spec.array = self.array.as_ref().map(|(a, _)| a.clone());
        spec.dependencies = self.dependencies.clone();
        spec.begin_ms = self.begin_s.map(|s| (s.max(0) as u64).saturating_mul(1000));
        spec.hold = self.hold;
        spec.signal = self.signal.clone();
        spec.open_append = self.open_append;
        spec.switches = self.switches;
        spec.submit_host = self.ctx.host.clone();
        spec.extra = std::mem::take(&mut self.extra);
        spec.set_no_requeue(self.no_requeue);
    }
}

/// The job's environment for `--export`: `ALL` (everything), `NONE` (nothing; the node adds
/// the `SLURM_*` variables), or a list of names and `NAME=value` pairs, with or without `ALL`.
pub fn export_env(export: &str, env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let items: Vec<&str> = export.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    let mut out = BTreeMap::new();
    if items.iter().any(|i| i.eq_ignore_ascii_case("ALL")) || items.is_empty() {
        out = env.clone();
    } else {
        // Slurm passes its own SLURM_* variables in any case.
        out.extend(env.iter().filter(|(k, _)| k.starts_with("SLURM_")).map(|(k, v)| (k.clone(), v.clone())));
    }
    if items.iter().any(|i| i.eq_ignore_ascii_case("NONE") || i.eq_ignore_ascii_case("NIL")) {
        return out.into_iter().filter(|(k, _)| k.starts_with("SLURM_")).collect();
    }
    for item in items {
        if item.eq_ignore_ascii_case("ALL") {
            continue;
        }
        match item.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                out.insert(k.to_string(), v.to_string());
            }
            Some(_) => {}
            None => {
                if let Some(v) = env.get(item) {
                    out.insert(item.to_string(), v.clone());
                }
            }
        }
    }
    out
}

/// The `sbatch` command.
pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let ctx = Context::current()?;
    let stdin_text;
    let source = if args_have_script(args) {
        ScriptSource::File
    } else {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| SlurmError::fatal(PROG, format!("read standard input: {e}")))?;
        stdin_text = text;
        ScriptSource::Text(&stdin_text)
    };
    let sub = match parse(args, &ctx, source)? {
        Action::Print(text) => {
            print!("{text}");
            return Ok(0);
        }
        Action::Submit(sub) => sub,
    };
    print_warnings(&sub.warnings, sub.quiet);
    if sub.test_only {
        return test_only(&sub);
    }
    submit_and_report(&sub)
}

/// Names on stderr the options a submission accepted without effect (not with `--quiet`).
pub fn print_warnings(warnings: &[String], quiet: bool) {
    if !quiet {
        for line in warnings {
            eprintln!("{line}");
        }
    }
}

/// `--test-only`: what the scheduler would do with the job now, in Slurm's words; nothing is
/// submitted.
fn test_only(sub: &Submission) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    let reply = super::block_on(PROG, super::call(PROG, &cluster, ClientRequest::TestSubmit { spec: sub.spec.clone() }))??;
    let Reply::TestSubmitted { job, start_ms, nodes, cpus, reasons } = reply else {
        return Err(SlurmError::fatal(PROG, format!("unexpected reply {reply:?}")));
    };
    eprintln!("{}", test_only_report(&sub.spec, job, start_ms, &nodes, cpus, &reasons)?);
    Ok(0)
}

/// The line `sbatch --test-only` prints, or the error when the job could never run.
pub fn test_only_report(
    spec: &proto::JobSpec,
    job: u64,
    start_ms: Option<u64>,
    nodes: &[String],
    cpus: u32,
    reasons: &[String],
) -> Result<String, SlurmError> {
    let partition = spec.partition.clone().unwrap_or_else(|| slurm_compat::env::DEFAULT_PARTITION.to_string());
    match start_ms {
        Some(ms) => Ok(format!(
            "{PROG}: Job {job} to start at {} using {cpus} processors on nodes {} in partition {partition}",
            super::time::datetime(ms),
            hostlist::compress(nodes)
        )),
        None if reasons.iter().any(|r| r.starts_with(proto::REASON_NEVER_PREFIX)) || reasons.is_empty() => Err(SlurmError::fatal(
            PROG,
            format!("Batch job submission failed: Requested node configuration is not available ({})", reasons.join("; ")),
        )),
        None => Ok(format!("{PROG}: Job {job} cannot start now and has no reservation yet: {}", reasons.join("; "))),
    }
}

/// True when the command line names a script file (or uses `--wrap`): otherwise the script
/// comes from stdin.
fn args_have_script(args: &[String]) -> bool {
    match opts::parse(PROG, OPTIONS, args, true) {
        Ok(p) => !p.operands.is_empty() || p.has("wrap") || p.has("help") || p.has("usage") || p.has("version"),
        Err(_) => true,
    }
}

fn submit_and_report(sub: &Submission) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    super::block_on(PROG, async {
        let reply = cluster
            .call_patiently(ClientRequest::Submit { spec: sub.spec.clone() }, super::PATIENCE)
            .await
            .map_err(|e| SlurmError::fatal(PROG, format!("Batch job submission failed: {}", super::describe_error(&e))))?;
        let Reply::Submitted { job } = reply else {
            return Err(SlurmError::fatal(PROG, format!("unexpected reply {reply:?}")));
        };
        if sub.parsable {
            println!("{job}");
        } else if !sub.quiet {
            println!("Submitted batch job {job}");
        }
        if !sub.wait {
            return Ok(0);
        }
        super::wait_for(PROG, &cluster, job).await
    })?
}

/// The job `corral submit SCRIPT` builds when the script holds `#SBATCH` directives: the
/// directives, then `overrides` (corral's own options given on its command line, as sbatch
/// option names), exactly as sbatch would combine them. `SBATCH_*` variables are not read.
pub fn spec_from_directives(
    script: &str,
    script_name: &str,
    script_args: Vec<String>,
    overrides: &[(&'static str, Option<String>)],
) -> Result<JobSpec, SlurmError> {
    let ctx = Context::current()?;
    check_script(script)?;
    let from_script = opts::parse(PROG, OPTIONS, &directives(script, "#SBATCH"), true)?;
    if let Some(first) = from_script.operands.first() {
        return Err(SlurmError::fatal(PROG, format!("Invalid directive found in batch script: {first}")));
    }
    let mut b = Builder::new(PROG, &ctx);
    for (name, value) in from_script.opts.iter().chain(overrides.iter()) {
        b.apply(name, value.as_deref())?;
    }
    Ok(b.finish(Some(script.to_string()), script_args, script_name.to_string())?.spec)
}
