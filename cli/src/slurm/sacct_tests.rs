//! `sacct`'s fields against Slurm 22.05's source: the table of names, widths and print routines
//! (`src/sacct/sacct.c`), `--format` as `options.c` reads it, `--helpformat`, and each field's
//! value on a job's line and a step's as `print.c` prints it.

use std::collections::BTreeMap;

use proto::{GresRequest, Job, JobSpec, JobState, StepRecord};

use super::sacct::{self, Column, Ctx, Row, Style, Units};
use super::sacct_fields::{self, Print};
use super::time;

fn names() -> BTreeMap<u64, String> {
    [(1, "gpu01".to_string()), (2, "gpu02".to_string())].into_iter().collect()
}

const SUBMIT_MS: u64 = 1_800_000_000_000;
const START_MS: u64 = SUBMIT_MS + 10_000;

fn step(step: u32, name: &str, exit_code: i32, signal: Option<i32>) -> StepRecord {
    StepRecord {
        step,
        name: name.into(),
        nodes: vec!["gpu01".into()],
        ntasks: 1,
        start_ms: START_MS + 1_000,
        end_ms: Some(START_MS + 31_000),
        ended_on: vec!["gpu01".into()],
        exit_code,
        signal,
    }
}

/// A batch job of 8 CPUs, 2 GPUs and 16 GiB on gpu01 with an 8-hour limit that ran 65 s and
/// exited 3, with a step that exited 2 and one that succeeded.
fn failed_job() -> Job {
    let mut s = JobSpec::command(vec!["x".into()], "/w", "alice");
    s.name = "train".into();
    s.set_batch(true);
    s.cpus_per_task = 8;
    s.mem_mib = 16 * 1024;
    s.gres = Some(GresRequest { gpu_type: Some("h100".into()), count: 2, ..Default::default() });
    s.time_limit_ms = Some(8 * 3_600_000);
    s.account = Some("phys".into());
    s.constraint = vec!["h100".into()];
    s.extra.insert("comment".into(), "nightly run".into());
    (s.uid, s.gid) = (Some(1000), Some(0));
    let mut j = Job::submitted(70, s.into(), SUBMIT_MS);
    j.state = JobState::Failed;
    j.exit_code = Some(3);
    j.run = 1;
    j.start_ms = Some(START_MS);
    j.end_ms = Some(START_MS + 65_000);
    j.last_nodes = vec![1];
    j.steps = vec![step(0, "python", 2, None), step(1, "hostname", 0, None)];
    j
}

/// The `-P` lines of `job` and its steps in `fields`.
fn lines(job: &Job, fields: &str) -> Vec<String> {
    let cols = sacct::parse_fields(fields).expect("fields");
    let text = sacct::table_rows(&sacct::rows(&[job], true), &cols, Style::Parsable2, false, &names(), START_MS + 3_600_000);
    text.lines().map(str::to_string).collect()
}

#[test]
fn format_names_match_as_sacct_22_05_matches_them() {
    let names_of = |text: &str| sacct::parse_fields(text).expect("fields").iter().map(|c| c.name).collect::<Vec<_>>();
    // Any case, any start of a name; the first field of the table that starts so wins.
    assert_eq!(
        names_of("derivedexitcode,REQTRES,jobn,Elapsed,elapsedr,sta,stat"),
        ["DerivedExitCode", "ReqTRES", "JobName", "Elapsed", "ElapsedRaw", "Start", "State"]
    );
    // `A`, `AL` and `ALL` are every one of Slurm's fields (`xstrncasecmp("ALL", name, len)`).
    assert_eq!(names_of("ALL").len(), 109);
    assert_eq!(names_of("a"), names_of("all"));
    // Slurm's -l fields use such starts (`tresusageinmaxn`).
    assert_eq!(names_of(sacct::LONG_FIELDS).len(), 54);
    assert!(names_of(sacct::LONG_FIELDS).contains(&"TRESUsageInMaxNode"));
    // A width replaces the default, sign included: JobID%20 is right-justified, %-20 left.
    assert_eq!(
        sacct::parse_fields("JobID%20,JobID%-20,Reason,NodeList").expect("fields"),
        [
            Column { name: "JobID", width: 20 },
            Column { name: "JobID", width: -20 },
            Column { name: "Reason", width: 22 },
            Column { name: "NodeList", width: 15 }
        ]
    );
    // Slurm's words for what it refuses; only leading blanks are skipped.
    let err = |text: &str| sacct::parse_fields(text).expect_err(text).text;
    assert_eq!(err("Bogus"), "sacct: error: Invalid field requested: \"Bogus\"");
    assert_eq!(err("JobID ,State"), "sacct: error: Invalid field requested: \"JobID \"");
    assert_eq!(err("JobIDs%3"), "sacct: error: Invalid field requested: \"JobIDs\"");
    assert_eq!(err("allocgres"), "sacct: fatal: AllocGRES has been removed, please use AllocTRES");
    assert_eq!(err("ReqGRES"), "sacct: fatal: ReqGRES has been removed, please use ReqTRES");
    assert_eq!(names_of(" State, ExitCode"), ["State", "ExitCode"]);
    // -o lists add up, then -b's and -l's fields; none: SACCT_FORMAT, else the default.
    assert_eq!(sacct::field_list(&["jobid", "state"], true, false, None), "jobid,state,jobid,state,exitcode");
    assert_eq!(sacct::field_list(&[], false, false, Some("jobid,elapsed".into())), "jobid,elapsed");
    assert_eq!(sacct::field_list(&[], false, false, None), sacct::DEFAULT_FIELDS);
}

#[test]
fn helpformat_lists_the_fields_as_sacct_22_05() {
    let text = sacct_fields::helpformat();
    let rows: Vec<&str> = text.lines().collect();
    assert_eq!(rows[0], "Account             AdminComment        AllocCPUS           AllocNodes         ");
    assert_eq!(rows[1], "AllocTRES           AssocID             AveCPU              AveCPUFreq         ");
    assert_eq!(rows[26], "User                UserCPU             WCKey               WCKeyID            ");
    // Corral's own fields come after Slurm's 109, whose last is WorkDir.
    assert_eq!(rows[27], "WorkDir             ArrayJobID          ArrayTaskID         GPUSeconds         ");
    assert_eq!(rows[28], "Restarts           ");
    assert_eq!(rows.len(), 29);
    assert!(text.ends_with("Restarts           \n"));
}

#[test]
fn columns_cut_as_each_print_routine_does() {
    let mut job = failed_job();
    std::sync::Arc::make_mut(&mut job.spec).name = "a_rather_long_name".into();
    let cols = sacct::parse_fields("JobID%4,JobName%6,Start%10,Elapsed%3,CPUTimeRAW%2,NodeList").expect("fields");
    let text = sacct::table(&[&job], &cols, Style::Columns, true, &names(), 0);
    let start = time::datetime(START_MS);
    // Headers are cut without a `+`, strings with one, dates without; numbers and durations are
    // printed whole whatever the width.
    assert_eq!(
        text,
        format!(
            "JobI JobNam      Start Ela CP        NodeList \n\
             ---- ------ ---------- --- -- --------------- \n\
             \x20 70 a_rat+ {} 00:01:05 520           gpu01 \n",
            &start[..10]
        )
    );
}

#[test]
fn job_and_step_lines_of_the_fields_scripts_use() {
    let job = failed_job();
    let fields = "JobID,State,ExitCode,DerivedExitCode,ReqTRES,AllocTRES,Elapsed,Timelimit";
    assert_eq!(
        lines(&job, fields),
        [
            "70|FAILED|3:0|2:0|billing=8,cpu=8,gres/gpu=2,mem=16G,node=1|billing=8,cpu=8,gres/gpu=2,mem=16G,node=1|00:01:05|08:00:00",
            "70.batch|FAILED|3:0|||cpu=8,gres/gpu=2,mem=16G,node=1|00:01:05|",
            "70.extern|COMPLETED|0:0|||billing=8,cpu=8,gres/gpu=2,mem=16G,node=1|00:01:05|",
            "70.0|FAILED|2:0|||cpu=8,gres/gpu=2,mem=16G,node=1|00:00:30|",
            "70.1|COMPLETED|0:0|||cpu=8,gres/gpu=2,mem=16G,node=1|00:00:30|",
        ]
    );
    let fields = "JobID,ReqCPUS,ReqMem,ReqNodes,AllocNodes,NNodes,NCPUS,AllocCPUS,NTasks,TimelimitRaw,CPUTime,CPUTimeRAW,ElapsedRaw";
    assert_eq!(
        lines(&job, fields)[..2],
        ["70|8|16G|1|1|1|8|8||480|00:08:40|520|65".to_string(), "70.batch|8||1|1|1|8|8|1||00:08:40|520|65".to_string()]
    );
    let fields = "JobID,Reason,Comment,Constraints,QOS,Account,Partition,Priority,Flags,Cluster,WorkDir,Layout,User,UID,Group,Restarts";
    assert_eq!(
        lines(&job, fields)[..4],
        [
            "70|None|nightly run|h100|normal|phys|default|0||corral|/w||alice|1000|root|0".to_string(),
            "70.batch|||||phys||||corral||Unknown||||".to_string(),
            "70.extern|||||phys||||corral||Unknown||||".to_string(),
            // One task on one node: srun's cyclic default, as the peer's sacct showed it.
            "70.0|||||phys||||corral||Cyclic||||".to_string(),
        ]
    );
    // What Corral does not record prints as Slurm prints a field the database lacks.
    let fields = "JobID,TRESUsageInTot,MaxRSS,AveCPU,AveCPUFreq,ReqCPUFreq,ReqCPUFreqGov,ConsumedEnergy,ConsumedEnergyRaw,TotalCPU,UserCPU,Reservation,WCKey,WCKeyID,AssocID,DBIndex";
    assert_eq!(
        lines(&job, fields)[..2],
        [
            // As Slurm 22.05.8 with slurmdbd printed them: a job's energy empty, a step's 0;
            // the batch step's requested CPU frequency 0.
            "70|||||Unknown|Unknown|||00:00:00|00:00:00|||0||".to_string(),
            "70.batch||||0|0|0|0|0|00:00:00|00:00:00|||||".to_string()
        ]
    );
    // Times: a step's own, its submit and eligible time its start; the job's window.
    let fields = "JobID,Submit,Eligible,Start,End,Reserved,ResvCPU,ResvCPURAW,Suspended";
    let (submit, start, end) = (time::datetime(SUBMIT_MS), time::datetime(START_MS), time::datetime(START_MS + 65_000));
    let step_start = time::datetime(START_MS + 1_000);
    assert_eq!(
        lines(&job, fields)[..4],
        [
            format!("70|{submit}|{submit}|{start}|{end}|00:00:10|00:01:20|80|00:00:00"),
            format!("70.batch|{start}|{start}|{start}|{end}||||00:00:00"),
            format!("70.extern|{start}|{start}|{start}|{end}||||00:00:00"),
            format!("70.0|{step_start}|{step_start}|{step_start}|{}||||00:00:00", time::datetime(START_MS + 31_000)),
        ]
    );
}

#[test]
fn derived_exit_code_is_the_highest_of_the_steps() {
    let mut job = failed_job();
    let derived = |j: &Job| sacct::value(j, "DerivedExitCode", &names(), 0);
    assert_eq!(derived(&job), "2:0");
    // A wait status: an exit code outranks a signal (2 << 8 against 9).
    job.steps.push(step(2, "sleep", 0, Some(9)));
    assert_eq!(derived(&job), "2:0");
    job.steps.retain(|s| s.step == 2);
    assert_eq!(derived(&job), "0:9");
    job.steps.clear();
    assert_eq!(derived(&job), "0:0");
    // ExitCode drops 128 from a code of 128 or more (print.c), DerivedExitCode does not.
    job.exit_code = Some(130);
    job.steps = vec![step(0, "python", 130, None)];
    let line = lines(&job, "JobID,ExitCode,DerivedExitCode");
    assert_eq!(line[0], "70|2:0|130:0");
    assert_eq!(line[3], "70.0|2:0|");
    assert_eq!(
        super::scontrol::with_derived_exit_code("JobId=70\n   Requeue=0 ExitCode=130:0\n   RunTime=x\n\n", &job),
        "JobId=70\n   Requeue=0 ExitCode=130:0\n   DerivedExitCode=130:0\n   RunTime=x\n\n"
    );
}

#[test]
fn a_pending_job_shows_its_request() {
    let mut s = JobSpec::command(vec!["x".into()], "/w", "alice");
    s.cpus_per_task = 4;
    s.nodes = 2;
    s.mem_mib = 1536;
    s.hold = true;
    let job = Job::submitted(80, s.into(), SUBMIT_MS);
    let fields = "JobID,State,AllocCPUS,ReqCPUS,AllocNodes,ReqNodes,NNodes,AllocTRES,ReqTRES,ReqMem,NodeList,Start,End,Eligible,Reserved,Elapsed,Timelimit,TimelimitRaw,Reason,ExitCode,DerivedExitCode";
    assert_eq!(lines(&job, fields), [
        "80|PENDING|8|8|0|2|2||billing=8,cpu=8,mem=3G,node=2|3G|None assigned|Unknown|Unknown|Unknown|00:00:00|00:00:00|UNLIMITED|UNLIMITED|JobHeldUser|0:0|0:0"
    ]);
}

#[test]
fn units_convert_as_sacct_does() {
    let mut job = failed_job();
    std::sync::Arc::make_mut(&mut job.spec).mem_mib = 1536;
    let cell = |units: Units, name: &str| {
        let names = names();
        sacct::cell_value(Row::Job(&job), name, &Ctx { names: &names, now_ms: 0, units })
    };
    // Exact conversion by default: half units count (1536M is 1.50G).
    assert_eq!(cell(Units::default(), "ReqMem"), "1.50G");
    assert_eq!(cell(Units::default(), "ReqTRES"), "billing=8,cpu=8,gres/gpu=2,mem=1.50G,node=1");
    assert_eq!(cell(Units { unit: None, no_convert: true }, "ReqMem"), "1536M");
    assert_eq!(cell(Units { unit: Some(1), no_convert: false }, "ReqMem"), "1572864K");
    assert_eq!(cell(Units { unit: Some(3), no_convert: false }, "AllocTRES"), "billing=8,cpu=8,gres/gpu=2,mem=1.50G,node=1");
    assert_eq!(cell(Units { unit: Some(4), no_convert: false }, "ReqMem"), "0.00T");
    assert_eq!(Units::parse_unit("g"), Ok(3));
    assert_eq!(
        Units::parse_unit("x").expect_err("x").text,
        "sacct: error: Invalid unit type 'x'. Possible options are 'KMGTP'\nsacct: fatal: Invalid unit type"
    );
}

#[test]
fn print_kinds_of_the_table() {
    assert_eq!(sacct_fields::print_of("Elapsed"), Print::Secs);
    assert_eq!(sacct_fields::print_of("Start"), Print::Date);
    assert_eq!(sacct_fields::print_of("ElapsedRaw"), Print::Uint);
    assert_eq!(sacct_fields::print_of("AllocNodes"), Print::Str);
    assert_eq!(sacct_fields::cell("abcdef", 4, Print::Str), "abc+");
    assert_eq!(sacct_fields::cell("abcdef", -8, Print::Date), "abcdef  ");
    assert_eq!(sacct_fields::cell("2-00:00:00", 5, Print::Secs), "2-00:00:00");
}

#[test]
fn system_comment_has_a_line_per_repair_on_the_job_line_alone() {
    let mut job = failed_job();
    let first_ms = START_MS + 5_000;
    let second_ms = START_MS + 9_000;
    job.repairs = vec![
        proto::Repair { run: 1, rank: 1, lost: 2, spare: 1, at_ms: first_ms, reason: "node gpu02 down: no heartbeat for 3086 ms".into() },
        proto::Repair { run: 2, rank: 3, lost: 7, spare: 2, at_ms: second_ms, reason: "node 7: node restarted".into() },
    ];
    let expected = format!(
        "run 1 rank 1 moved from gpu02 to spare gpu01 at {} (node gpu02 down: no heartbeat for 3086 ms)\n\
         run 2 rank 3 moved from node7 to spare gpu02 at {} (node 7: node restarted)",
        time::datetime(first_ms),
        time::datetime(second_ms)
    );
    // Slurm prints the comment's lines as they are; a step's field is empty.
    let text = lines(&job, "JobID,SystemComment").join("\n");
    assert_eq!(text, format!("70|{expected}\n70.batch|\n70.extern|\n70.0|\n70.1|"));
    assert_eq!(lines(&failed_job(), "SystemComment")[0], "", "a job never repaired has none");
    // `sacct --json`: `comment.system`, null without repairs.
    assert_eq!(sacct::db_job(&job, &names(), START_MS, false)["comment"]["system"], serde_json::json!(expected));
    assert_eq!(sacct::db_job(&failed_job(), &names(), START_MS, false)["comment"]["system"], serde_json::Value::Null);
}

#[test]
fn a_job_of_a_node_range_shows_the_nodes_it_got() {
    let mut s = JobSpec::command(vec!["x".into()], "/w", "alice");
    s.nodes = 2;
    s.set_nodes_max(4);
    s.gres = Some(GresRequest { gpu_type: None, count: 8, ..Default::default() });
    let pending = Job::submitted(81, s.into(), SUBMIT_MS);
    let fields = "JobID,NNodes,ReqNodes,AllocNodes,AllocCPUS,NodeList";
    assert_eq!(lines(&pending, fields), ["81|2|2|0|2|None assigned"]);
    let text = super::scontrol::job_text(&pending, &names(), START_MS);
    assert!(text.contains("   NumNodes=2-4 NumCPUs=2 NumTasks=2 "), "pending: its range, as Slurm shows it\n{text}");
    // Started on three nodes of its range.
    let mut job = pending;
    job.state = JobState::Running;
    (job.run, job.start_ms, job.last_nodes) = (1, Some(START_MS), vec![1, 2, 3]);
    let line = &lines(&job, &format!("{fields},AllocTRES"))[0];
    assert_eq!(line, "81|3|2|3|3|gpu[01-02],node3|billing=3,cpu=3,gres/gpu=24,mem=3G,node=3");
    let text = super::scontrol::job_text(&job, &names(), START_MS);
    assert!(text.contains("   NumNodes=3 NumCPUs=3 NumTasks=3 ") && text.contains(",node=3,"), "{text}");
    assert_eq!(sacct::db_job(&job, &names(), START_MS, false)["allocation_nodes"], serde_json::json!(3));
}
