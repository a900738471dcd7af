//! The fuzz targets' entry points (`proto::fuzzing`, `corral_cli::slurm::fuzzing`) under a small
//! mutation fuzzer on stable Rust, so every CI run fuzzes even without nightly: seeds from real
//! messages and the seed job scripts, mutated by bit flips, byte edits, splices, truncation and
//! large length prefixes. `cargo +nightly fuzz run TARGET` (in `fuzz/`, see `scripts/fuzz.sh`)
//! runs the same entry points under libFuzzer with coverage guidance.
//!
//! `CORRAL_FUZZ_SECONDS` (default 4 per target) and `CORRAL_FUZZ_SEED` repeat a run.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use proto::{ClientRequest, Command, Envelope, JobSpec, Reply};

/// xorshift64*: enough randomness for mutations, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, pool: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(len + 1);
                input.insert(i, rng.next() as u8);
            }
            3 if len > 0 => {
                input.remove(rng.below(len));
            }
            4 if len > 0 => input.truncate(rng.below(len)),
            5 => {
                // A varint that claims a huge length.
                let i = rng.below(len + 1);
                for b in [0xff, 0xff, 0xff, 0xff, 0x0f] {
                    input.insert(i.min(input.len()), b);
                }
            }
            6 if !pool.is_empty() => {
                let other = &pool[rng.below(pool.len())];
                let (a, b) = (rng.below(other.len() + 1), rng.below(other.len() + 1));
                let at = rng.below(len + 1);
                let piece: Vec<u8> = other[a.min(b)..a.max(b)].to_vec();
                input.splice(at..at, piece);
            }
            _ if len > 0 => {
                let (a, b) = (rng.below(len), rng.below(len));
                let piece: Vec<u8> = input[a.min(b)..a.max(b)].to_vec();
                input.extend_from_slice(&piece);
            }
            _ => input.push(rng.next() as u8),
        }
    }
    input.truncate(64 * 1024);
}

/// Runs `target` on mutations of `seeds` for the configured time; on a panic, saves the input
/// and fails with the line that reproduces it.
fn fuzz(name: &str, seeds: Vec<Vec<u8>>, target: fn(&[u8])) {
    let seconds: u64 = std::env::var("CORRAL_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let seed: u64 = std::env::var("CORRAL_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) | 1
    });
    println!("fuzz {name}: seed {seed}, {seconds} s (repeat: CORRAL_FUZZ_SEED={seed} cargo test --workspace --test fuzz_smoke {name})");
    let mut rng = Rng(seed);
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut runs = 0u64;
    let mut pool = seeds.clone();
    for s in &seeds {
        target(s);
    }
    while Instant::now() < deadline {
        let mut input = pool[rng.below(pool.len())].clone();
        mutate(&mut rng, &mut input, &seeds);
        if std::panic::catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            let path = std::env::temp_dir().join(format!("corral-fuzz-{name}-{seed}.bin"));
            std::fs::write(&path, &input).expect("save the failing input");
            panic!(
                "fuzz target {name} panicked on {} (input saved); repeat: CORRAL_FUZZ_SEED={seed} cargo test --workspace --test fuzz_smoke {name}, or cargo +nightly fuzz run {name} {}",
                path.display(),
                path.display()
            );
        }
        if pool.len() < 256 && rng.below(16) == 0 {
            pool.push(input);
        }
        runs += 1;
    }
    println!("fuzz {name}: {runs} runs, no panic");
    assert!(runs > 0);
}

fn spec() -> JobSpec {
    let mut spec = JobSpec::command(vec!["sh".into(), "-c".into(), "echo hi".into()], "/tmp", "alice");
    spec.env.insert("PATH".into(), "/usr/bin:/bin".into());
    spec.nodes = 2;
    spec.gres = Some(proto::GresRequest::parse("gpu:h100:4").expect("gres"));
    spec
}

#[test]
fn envelope() {
    let seeds = vec![
        proto::encode(&Envelope { hops: 0, request: ClientRequest::Submit { spec: spec() }.into(), user: Some("alice".into()) }),
        proto::encode(&Envelope { hops: 1, request: ClientRequest::Cancel { job: 7 }.into(), user: None }),
        proto::encode(&Envelope { hops: 0, request: ClientRequest::ListJobs { include_finished: true }.into(), user: None }),
    ];
    fuzz("envelope", seeds, proto::fuzzing::envelope);
}

#[test]
fn command() {
    let seeds = vec![proto::encode(&Command::Submit { spec: spec(), now_ms: 5 }), proto::encode(&Command::Cancel { job: 3, now_ms: 9 })];
    fuzz("command", seeds, proto::fuzzing::command);
}

#[test]
fn response() {
    let seeds = vec![
        proto::encode::<proto::Response>(&Ok(Reply::Submitted { job: 42 })),
        proto::encode::<proto::Response>(&Err(proto::ApiError::NoLeader)),
    ];
    fuzz("response", seeds, proto::fuzzing::response);
}

#[test]
fn sbatch() {
    let seed_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/seed");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&seed_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "sbatch"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect();
    seeds.push(
        b"#!/bin/bash\n#SBATCH -J t -N 2-4 --ntasks-per-node=8 --gres=gpu:h100:8 -t 1-02:03:04\n#SBATCH --array=1-37%4 --signal=B:USR1@90\n#SBATCH -d afterok:12:13,singleton --mem-per-gpu=80G -o %x-%A_%a.out\nsrun python train.py\n"
            .to_vec(),
    );
    fuzz("sbatch", seeds, corral_cli::slurm::fuzzing::sbatch_script);
}

#[test]
fn hostlist() {
    let seeds = vec![b"gpu[01-04,07]".to_vec(), b"n[1-3],x[001-002]-ib,solo".to_vec(), b"a[0-9][0-9]".to_vec()];
    fuzz("hostlist", seeds, corral_cli::slurm::fuzzing::hostlist);
}
