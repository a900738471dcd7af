//! Where a step's output goes (`srun --output`/`--error` inside an allocation), as Slurm's
//! srun takes them: `all` (srun's own stdout and stderr, the default), `none`, a task number
//! (that task's alone, to srun's), or a file name pattern (`%t` a file per task, `%n`/`%N` per
//! node, `%j`, `%J`, `%s`, `%x`, `%u`, `%A`, `%a`, `%%`). Without `--error`, stderr goes where
//! `--output` says. Files are opened (truncated, or appended with `--open-mode=append`) as
//! their first output arrives, by `srun` where it runs, relative to the step's working
//! directory; Slurm's slurmstepd opens those of `%t`, `%n` and `%N` on each task's node, which
//! is the same file where that directory is shared.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use slurm_compat::env::PatternFields;

use super::step::PROG;

/// Where one stream of a step's tasks goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sink {
    Terminal,
    Nowhere,
    /// Task N's alone, to srun's own.
    Task(u32),
    /// A file name pattern.
    Files(String),
}

impl Sink {
    /// Parses one of `--output`'s or `--error`'s values.
    pub fn parse(text: &str) -> Sink {
        match text {
            "all" => Sink::Terminal,
            "none" => Sink::Nowhere,
            n if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => n.parse().map_or(Sink::Files(n.to_string()), Sink::Task),
            pattern => Sink::Files(pattern.to_string()),
        }
    }

    /// stdout's and stderr's: `--output` and `--error` (stderr follows `--output` without one).
    pub fn pair(output: Option<&str>, error: Option<&str>) -> (Sink, Sink) {
        let out = output.map_or(Sink::Terminal, Sink::parse);
        let err = error.map_or_else(|| out.clone(), Sink::parse);
        (out, err)
    }

    /// Whether output of task `rank` going here is shown on srun's own stream.
    pub fn shows(&self, rank: u32) -> bool {
        match self {
            Sink::Terminal => true,
            Sink::Task(r) => *r == rank,
            Sink::Nowhere | Sink::Files(_) => false,
        }
    }
}

/// What names a step's output files, besides the task.
#[derive(Clone, Debug, Default)]
pub struct StepNaming {
    pub job: u64,
    pub array_job: u64,
    pub array_task: Option<u32>,
    pub name: String,
    pub user: String,
    pub step: u32,
    /// Each rank's node and its place among the job's nodes.
    pub nodes: Vec<(String, usize)>,
    pub workdir: PathBuf,
    pub append: bool,
}

impl StepNaming {
    /// The file pattern `pattern` names for task `rank`.
    pub fn path(&self, pattern: &str, rank: u32) -> PathBuf {
        let (node_name, node_index) = self.nodes.get(rank as usize).map_or(("", 0), |(n, i)| (n.as_str(), *i));
        let fields = PatternFields {
            job: self.job,
            array_job: self.array_job,
            array_task: self.array_task,
            name: &self.name,
            user: &self.user,
            node_name,
            node_index,
            rank,
            step: Some(self.step),
        };
        self.workdir.join(slurm_compat::env::expand_pattern(pattern, &fields))
    }
}

/// The files a step's output went to so far, each opened once; a file that cannot be opened
/// is said once and its output dropped.
#[derive(Default)]
pub struct OutputFiles {
    pub naming: StepNaming,
    open: BTreeMap<PathBuf, Option<std::fs::File>>,
}

impl OutputFiles {
    pub fn new(naming: StepNaming) -> OutputFiles {
        OutputFiles { naming, open: BTreeMap::new() }
    }

    /// Appends `data` of task `rank` to the file `pattern` names for it.
    pub fn write(&mut self, pattern: &str, rank: u32, data: &[u8]) {
        let path = self.naming.path(pattern, rank);
        let append = self.naming.append;
        let file = self.open.entry(path.clone()).or_insert_with(|| open(&path, append));
        if let Some(f) = file {
            if let Err(e) = f.write_all(data) {
                eprintln!("{PROG}: error: write to {}: {e}", path.display());
                *file = None;
            }
        }
    }

    /// How many files were opened.
    pub fn count(&self) -> usize {
        self.open.values().filter(|f| f.is_some()).count()
    }
}

/// Opens an output file as slurmstepd does: truncated, or appended to with `append`.
fn open(path: &Path, append: bool) -> Option<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).write(true);
    if append {
        options.append(true);
    } else {
        options.truncate(true);
    }
    match options.open(path) {
        Ok(f) => Some(f),
        Err(e) => {
            let why = e.to_string().split(" (os error").next().unwrap_or_default().to_string();
            eprintln!("{PROG}: error: Could not open output file {}: {why}", path.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_error_take_slurms_forms() {
        assert_eq!(Sink::pair(None, None), (Sink::Terminal, Sink::Terminal));
        assert_eq!(Sink::pair(Some("out-%t.txt"), None), (Sink::Files("out-%t.txt".into()), Sink::Files("out-%t.txt".into())));
        assert_eq!(Sink::pair(Some("none"), Some("all")), (Sink::Nowhere, Sink::Terminal));
        assert_eq!(Sink::pair(Some("1"), None), (Sink::Task(1), Sink::Task(1)));
        assert!(Sink::Task(1).shows(1) && !Sink::Task(1).shows(0) && !Sink::Nowhere.shows(0));
    }

    #[test]
    fn a_pattern_names_a_file_per_task_node_and_step() {
        let naming = StepNaming {
            job: 128,
            array_job: 128,
            name: "train".into(),
            user: "alice".into(),
            step: 0,
            nodes: vec![("gpu1".into(), 0), ("gpu1".into(), 0), ("gpu2".into(), 1), ("gpu2".into(), 1)],
            workdir: PathBuf::from("/w"),
            ..StepNaming::default()
        };
        assert_eq!(naming.path("job%J.out", 3), PathBuf::from("/w/job128.0.out"));
        assert_eq!(naming.path("job%4j.out", 3), PathBuf::from("/w/job0128.out"));
        assert_eq!(naming.path("job%j-%2t.out", 3), PathBuf::from("/w/job128-03.out"));
        assert_eq!(naming.path("%x-%N-%n-%s.log", 2), PathBuf::from("/w/train-gpu2-1-0.log"));
        assert_eq!(naming.path("/abs/%u%%.txt", 0), PathBuf::from("/abs/alice%.txt"));
    }

    #[test]
    fn tasks_of_one_file_share_it_and_each_pattern_opens_its_own() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("all.txt"), "old contents\n").expect("write");
        let naming = StepNaming {
            job: 7,
            step: 2,
            nodes: vec![("n1".into(), 0), ("n2".into(), 1)],
            workdir: dir.path().into(),
            ..Default::default()
        };
        let mut files = OutputFiles::new(naming);
        files.write("all.txt", 0, b"zero\n");
        files.write("all.txt", 1, b"one\n");
        files.write("t%t.txt", 0, b"a");
        files.write("t%t.txt", 1, b"b");
        assert_eq!(files.count(), 3);
        drop(files);
        let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();
        assert_eq!((read("all.txt"), read("t0.txt"), read("t1.txt")), ("zero\none\n".into(), "a".into(), "b".into()));
    }
}
