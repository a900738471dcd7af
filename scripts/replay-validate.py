#!/usr/bin/env python3
"""Validates `corral replay` against a real Corral cluster: replays a Philly slice in real time
on a local `corral dev up` cluster (real corrald processes, simulated GPUs, each job a real
`sleep` submitted through the `sbatch` shim at its time), reads each job's submission, start
and end from the cluster, replays the same slice with `corral replay`, and prints how far the
simulated start times are from the real ones (mean absolute difference, and the share of jobs
whose start order agrees).

    scripts/replay-validate.py --bin /var/tmp/corral-target/debug \\
        --slice ../shared/traces/philly/slices/philly_week_2017-10-22.csv --limit 100

With `--slurm DIR` the cluster is a real Slurm 22.05 that `scripts/slurm-nodes.sh up N DIR`
started (Debian's `sbatch`, its `SLURM_CONF`), each job writing its own start time, and the
replay's policy is the Slurm model (`slurm-22.05`).

The slice's users are set aside (every job is the submitting user's), as the replay's --user.
"""

import argparse
import concurrent.futures
import csv
import json
import os
import subprocess
import sys
import tempfile
import time


def run(cmd, env=None, check=True):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out.stdout


def limit_arg(seconds):
    """sbatch -t as minutes:seconds."""
    s = max(1, int(round(seconds)))
    return f"{s // 60}:{s % 60:02d}"


def sbatch_args(j, wrap):
    """The options a slice's job is submitted with, its command `wrap`."""
    return ["--parsable", "-N", j["nodes"], f"--gres=gpu:{j['gpus_per_node']}", "-t", limit_arg(float(j["limit_bucket_s"])),
            "-o", "/dev/null", "--wrap", wrap]


def submit_at_their_times(jobs, sbatch, env, wrap_of):
    """Submits each job at its `submit_s` from 2 s on; returns the origin (wall clock), each
    job's id and the time it was submitted at, from the origin."""
    ids, submitted = {}, {}
    t0 = time.time() + 2.0
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        futures = {}
        for j in jobs:
            delay = t0 + float(j["submit_s"]) - time.time()
            if delay > 0:
                time.sleep(delay)
            submitted[j["job"]] = time.time() - t0
            futures[pool.submit(run, [sbatch] + sbatch_args(j, wrap_of(j)), env)] = j["job"]
        for f, trace_id in futures.items():
            ids[trace_id] = int(f.result().strip().split(";")[0])
    return t0, ids, submitted


def wait_until_all_ended(squeue, env):
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline and run([squeue, "-h"], env).strip():
        time.sleep(2)


def replay_starts(corral, args, policy, work):
    """Each job's simulated start and end under `policy`, by the slice's job id."""
    starts_csv = os.path.join(work, "replay.csv")
    cmd = [corral, "replay", "philly", args.slice, "--nodes", str(args.nodes), "--gpus", args.gpus, "--policies", policy,
           "--user", "root", "--starts", starts_csv]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    run(cmd)
    return {r["job"]: r for r in csv.DictReader(open(starts_csv))}


def report(n_jobs, pairs, lag, work, what):
    """Prints how far the replay's starts are from the real ones: `pairs` holds (real start,
    replay start, job) of every job started in both, `lag` the driver's submission lags."""
    diffs = sorted(abs(real - sim) for real, sim, _ in pairs)
    by_real = [p[2] for p in sorted(pairs, key=lambda p: (p[0], int(p[2])))]
    by_sim = [p[2] for p in sorted(pairs, key=lambda p: (p[1], int(p[2])))]
    same = sum(1 for a, b in zip(by_real, by_sim) if a == b)
    n = len(diffs)
    print(f"jobs {n_jobs}, started in both {n}")
    print(f"start time, |{what}|: mean {sum(diffs) / n:.3f} s, p50 {diffs[n // 2]:.3f} s, "
          f"p99 {diffs[min(n - 1, int(n * 0.99))]:.3f} s, max {diffs[-1]:.3f} s")
    print(f"submission lag of the driver: mean {sum(lag) / n:.3f} s, max {max(lag):.3f} s")
    print(f"jobs in the same place of the start order: {same} of {n} ({100 * same / n:.1f}%)")
    print(f"files: {work}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="directory with corral and corrald")
    ap.add_argument("--slice", required=True)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", default="h100:8")
    ap.add_argument("--limit", type=int, default=None, help="first N jobs only")
    ap.add_argument("--keep", help="keep the cluster directory here")
    ap.add_argument("--slurm", help="a real Slurm's directory (scripts/slurm-nodes.sh up N DIR)")
    args = ap.parse_args()
    corral = os.path.join(args.bin, "corral")
    jobs = list(csv.DictReader(open(args.slice)))
    if args.limit:
        jobs = jobs[: args.limit]
    if args.slurm:
        return validate_slurm(args, corral, jobs)
    work = args.keep or tempfile.mkdtemp(prefix="corral-validate-")
    cluster = os.path.join(work, "cluster")
    run([corral, "dev", "up", "--nodes", str(args.nodes), "--gpus", args.gpus, "--min-job-age-s", "86400", "--dir", cluster])
    env = dict(os.environ, CORRAL_CLUSTER=cluster)
    shims = os.path.join(work, "bin")
    run([corral, "install-slurm-shims", shims])
    try:
        _, ids, _ = submit_at_their_times(jobs, os.path.join(shims, "sbatch"), env,
                                          lambda j: f"sleep {float(j['duration_s']):.3f}")
        wait_until_all_ended(os.path.join(shims, "squeue"), env)
        real = {}
        for trace_id, job in ids.items():
            real[trace_id] = json.loads(run([corral, "--cluster", cluster, "--json", "show", str(job)]))
    finally:
        if not args.keep:
            run([corral, "dev", "down", "--dir", cluster], check=False)
    with open(os.path.join(work, "real.json"), "w") as f:
        json.dump(real, f)
    first = jobs[0]
    origin_ms = real[first["job"]]["submit_time"] - float(first["submit_s"]) * 1000
    sim = replay_starts(corral, args, "corral", work)
    pairs, submit_lag = [], []
    with open(os.path.join(work, "compare.csv"), "w") as compare:
        compare.write("job,gpus,submit_s,real_start_s,replay_start_s,real_run_s,replay_run_s\n")
        for j in jobs:
            r, s = real[j["job"]], sim[j["job"]]
            if r.get("start_time") is None or not s["start_s"]:
                continue
            real_start = (r["start_time"] - origin_ms) / 1000
            submit_lag.append((r["submit_time"] - origin_ms) / 1000 - float(j["submit_s"]))
            pairs.append((real_start, float(s["start_s"]), j["job"]))
            real_run = (r["end_time"] - r["start_time"]) / 1000 if r.get("end_time") else ""
            replay_run = float(s["end_s"]) - float(s["start_s"]) if s["end_s"] else ""
            compare.write(f"{j['job']},{j['num_gpus']},{j['submit_s']},{real_start:.3f},{s['start_s']},{real_run},{replay_run}\n")
    report(len(jobs), pairs, submit_lag, work, "real - replay")


def validate_slurm(args, corral, jobs):
    work = args.keep or tempfile.mkdtemp(prefix="corral-validate-slurm-")
    starts_dir = os.path.join(work, "starts")
    os.makedirs(starts_dir, exist_ok=True)
    env = dict(os.environ, SLURM_CONF=os.path.join(os.path.abspath(args.slurm), "etc", "slurm.conf"))
    t0, ids, submitted = submit_at_their_times(
        jobs, "sbatch", env, lambda j: f"date +%s.%N > {starts_dir}/$SLURM_JOB_ID; sleep {float(j['duration_s']):.3f}")
    wait_until_all_ended("squeue", env)
    sim = replay_starts(corral, args, "slurm-22.05", work)
    pairs, lag = [], []
    with open(os.path.join(work, "compare.csv"), "w") as compare:
        compare.write("job,slurm_id,gpus,submit_s,real_start_s,replay_start_s\n")
        for j in jobs:
            path = os.path.join(starts_dir, str(ids[j["job"]]))
            s = sim[j["job"]]
            if not os.path.exists(path) or not s["start_s"]:
                continue
            real_start = float(open(path).read().strip()) - t0
            lag.append(submitted[j["job"]] - float(j["submit_s"]))
            pairs.append((real_start, float(s["start_s"]), j["job"]))
            compare.write(f"{j['job']},{ids[j['job']]},{j['num_gpus']},{j['submit_s']},{real_start:.3f},{s['start_s']}\n")
    report(len(jobs), pairs, lag, work, "real Slurm - model")


if __name__ == "__main__":
    main()
