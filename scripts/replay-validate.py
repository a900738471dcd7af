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
replay's policy is the Slurm model (`slurm-22.05`), compared also on slurmctld's own
`StartTime`. `--keep DIR` keeps the real run's files; `--reuse DIR` compares the replay again
against the run kept in DIR, without running the slice.

Each replay runs twice: on the slice as it is, and on the slice as the cluster ran it (each
job's submission as the driver made it, and its run as long as the cluster held it).

The slice's users are set aside (every job is the submitting user's), as the replay's --user.
"""

import argparse
import concurrent.futures
import csv
import json
import math
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
    # On a whole second: slurmctld's background loop wakes on whole seconds, as the Slurm
    # model's does on whole seconds of the replay's clock.
    t0 = float(math.ceil(time.time()) + 2)
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
    ap.add_argument("--keep", help="keep the run's files (and a real Slurm's job start files) here")
    ap.add_argument("--slurm", help="a real Slurm's directory (scripts/slurm-nodes.sh up N DIR)")
    ap.add_argument("--reuse", help="compare the replay against the real run kept in this directory (--keep of an "
                                    "earlier run) instead of running the slice again")
    args = ap.parse_args()
    corral = os.path.join(args.bin, "corral")
    jobs = list(csv.DictReader(open(args.slice)))
    if args.limit:
        jobs = jobs[: args.limit]
    if args.slurm:
        return validate_slurm(args, corral, jobs)
    return validate_corral(args, corral, jobs)


def run_on_corral(args, corral, jobs, work):
    """Runs the slice on a `corral dev` cluster; returns the driver's origin and each job as
    the cluster recorded it (`corral show`), kept in `real.json`."""
    cluster = os.path.join(work, "cluster")
    run([corral, "dev", "up", "--nodes", str(args.nodes), "--gpus", args.gpus, "--min-job-age-s", "86400", "--dir", cluster])
    env = dict(os.environ, CORRAL_CLUSTER=cluster)
    shims = os.path.join(work, "bin")
    run([corral, "install-slurm-shims", shims])
    try:
        t0, ids, _ = submit_at_their_times(jobs, os.path.join(shims, "sbatch"), env,
                                           lambda j: f"sleep {float(j['duration_s']):.3f}")
        wait_until_all_ended(os.path.join(shims, "squeue"), env)
        real = {}
        for trace_id, job in ids.items():
            real[trace_id] = json.loads(run([corral, "--cluster", cluster, "--json", "show", str(job)]))
    finally:
        run([corral, "dev", "down", "--dir", cluster], check=False)
    with open(os.path.join(work, "real.json"), "w") as f:
        json.dump(real, f)
    return t0, real


def write_as_run(slice_path, out_path, times):
    """The slice as a real cluster ran it: `times` maps a job to (its submission as the driver
    made it, how long the cluster held it, from its start to the end it recorded), both in
    seconds; jobs without times are left out."""
    with open(slice_path) as src, open(out_path, "w", newline="") as dst:
        rows = list(csv.DictReader(src))
        out = csv.DictWriter(dst, fieldnames=list(rows[0].keys()))
        out.writeheader()
        for row in rows:
            if row["job"] not in times:
                continue
            submit_s, held_s = times[row["job"]]
            row["submit_s"] = f"{submit_s:.3f}"
            if held_s is not None:
                row["duration_s"] = f"{max(0.0, held_s):.3f}"
            out.writerow(row)


def validate_corral(args, corral, jobs):
    """Replays the slice on a real Corral cluster, then `corral replay` twice: on the slice as
    it is, and on the slice as the cluster ran it (`write_as_run`)."""
    work = args.reuse or args.keep or tempfile.mkdtemp(prefix="corral-validate-")
    if args.reuse:
        with open(os.path.join(work, "real.json")) as f:
            real = json.load(f)
        # The driver started on a whole second just before the first submission.
        first = jobs[0]
        t0 = float(math.floor(real[first["job"]]["submit_time"] / 1000 - float(first["submit_s"])))
    else:
        t0, real = run_on_corral(args, corral, jobs, work)
    origin_ms = t0 * 1000
    held = os.path.join(work, "slice-as-run.csv")
    write_as_run(args.slice, held, {
        j: ((r["submit_time"] - origin_ms) / 1000,
            (r["end_time"] - r["start_time"]) / 1000 if r.get("end_time") and r.get("start_time") else None)
        for j, r in real.items()})
    for label, trace in (("the slice", args.slice), ("the slice as run", held)):
        sim = replay_starts(corral, argparse.Namespace(**{**vars(args), "slice": trace}), "corral", work)
        pairs, submit_lag = [], []
        with open(os.path.join(work, f"compare-{'asrun' if trace == held else 'slice'}.csv"), "w") as compare:
            compare.write("job,gpus,submit_s,real_start_s,replay_start_s,real_run_s,replay_run_s\n")
            for j in jobs:
                r, s = real[j["job"]], sim.get(j["job"])
                if r.get("start_time") is None or not s or not s["start_s"]:
                    continue
                real_start = (r["start_time"] - origin_ms) / 1000
                submit_lag.append((r["submit_time"] - origin_ms) / 1000 - float(j["submit_s"]))
                pairs.append((real_start, float(s["start_s"]), j["job"]))
                real_run = (r["end_time"] - r["start_time"]) / 1000 if r.get("end_time") else ""
                replay_run = float(s["end_s"]) - float(s["start_s"]) if s["end_s"] else ""
                compare.write(f"{j['job']},{j['num_gpus']},{j['submit_s']},{real_start:.3f},{s['start_s']},{real_run},{replay_run}\n")
        print(f"== corral replay on {label}")
        report(len(jobs), pairs, submit_lag, work, "real - replay")
        same, common = order_agreement([(p[0], int(p[2])) for p in pairs], [(p[1], int(p[2])) for p in pairs])
        print(f"jobs in the same relative order: {common} of {len(pairs)} ({100 * common / len(pairs):.1f}%)")


def slurm_times(env):
    """Each job's SubmitTime, StartTime and EndTime as slurmctld recorded them (whole seconds
    since the epoch), by Slurm job id: `MinJobAge=3600` keeps finished jobs that long."""
    times = {}
    for line in run(["scontrol", "show", "job", "-o"], env).splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "JobId" not in fields:
            continue
        def epoch(name):
            v = fields.get(name, "")
            return time.mktime(time.strptime(v, "%Y-%m-%dT%H:%M:%S")) if v[:1].isdigit() else None
        times[int(fields["JobId"])] = (epoch("SubmitTime"), epoch("StartTime"), epoch("EndTime"))
    return times


def order_agreement(real, model):
    """Jobs in the same place of two start orders, each a list of (time, job id) sorted; and
    the jobs of their longest common subsequence (in the same relative order)."""
    a, b = [j for _, j in sorted(real)], [j for _, j in sorted(model)]
    same = sum(1 for x, y in zip(a, b) if x == y)
    pos = {j: k for k, j in enumerate(b)}
    # Longest increasing subsequence of b's positions in a's order.
    tails = []
    for j in a:
        k = pos[j]
        lo, hi = 0, len(tails)
        while lo < hi:
            mid = (lo + hi) // 2
            if tails[mid] < k:
                lo = mid + 1
            else:
                hi = mid
        tails[lo:lo + 1] = [k]
    return same, len(tails)


def validate_slurm(args, corral, jobs):
    """Replays the slice on a real Slurm, then the model twice: on the slice as it is, and on
    the slice as the real Slurm saw it (each job's submission as the driver made it, and its
    run as long as slurmctld held it: `EndTime - StartTime`, the `sleep` plus Slurm's launch
    and teardown, which the model leaves out). Starts compare in slurmctld's whole seconds,
    the same second ordered by job id, as Slurm starts them."""
    work = args.reuse or args.keep or tempfile.mkdtemp(prefix="corral-validate-slurm-")
    starts_dir = os.path.join(work, "starts")
    if args.reuse:
        with open(os.path.join(work, "real-run.json")) as f:
            saved = json.load(f)
        t0, ids, submitted = saved["t0"], saved["ids"], saved["submitted"]
        with open(os.path.join(work, "slurm-times.json")) as f:
            recorded = {int(k): v for k, v in json.load(f).items()}
    else:
        os.makedirs(starts_dir, exist_ok=True)
        env = dict(os.environ, SLURM_CONF=os.path.join(os.path.abspath(args.slurm), "etc", "slurm.conf"))
        t0, ids, submitted = submit_at_their_times(
            jobs, "sbatch", env, lambda j: f"date +%s.%N > {starts_dir}/$SLURM_JOB_ID; sleep {float(j['duration_s']):.3f}")
        wait_until_all_ended("squeue", env)
        recorded = slurm_times(env)
        with open(os.path.join(work, "slurm-times.json"), "w") as f:
            json.dump({str(k): v for k, v in recorded.items()}, f)
        with open(os.path.join(work, "real-run.json"), "w") as f:
            json.dump({"t0": t0, "ids": ids, "submitted": submitted}, f)
    held = os.path.join(work, "slice-as-run.csv")
    times = {}
    for trace_id, slurm_id in ids.items():
        _, start, end = recorded.get(slurm_id, (None, None, None))
        times[trace_id] = (submitted[trace_id], end - start if start is not None and end is not None else None)
    write_as_run(args.slice, held, times)
    for label, trace in (("the slice", args.slice), ("the slice as run", held)):
        sim = replay_starts(corral, argparse.Namespace(**{**vars(args), "slice": trace}), "slurm-22.05", work)
        pairs, lag, real_s, model_s = [], [], [], []
        with open(os.path.join(work, f"compare-{'asrun' if trace == held else 'slice'}.csv"), "w") as compare:
            compare.write("job,slurm_id,gpus,submit_s,real_start_s,slurm_start_s,replay_start_s\n")
            for j in jobs:
                path = os.path.join(starts_dir, str(ids[j["job"]]))
                s = sim.get(j["job"])
                slurm_start = recorded.get(ids[j["job"]], (None, None, None))[1]
                if not os.path.exists(path) or not s or not s["start_s"] or slurm_start is None:
                    continue
                real_start = float(open(path).read().strip()) - t0
                lag.append(submitted[j["job"]] - float(j["submit_s"]))
                pairs.append((real_start, float(s["start_s"]), j["job"]))
                real_s.append((slurm_start, ids[j["job"]]))
                model_s.append((float(int(t0 + float(s["start_s"]))), ids[j["job"]]))
                compare.write(f"{j['job']},{ids[j['job']]},{j['num_gpus']},{j['submit_s']},{real_start:.3f},"
                              f"{slurm_start - t0:.3f},{s['start_s']}\n")
        print(f"== the model on {label}")
        report(len(jobs), pairs, lag, work, "job's own start - model")
        diffs = sorted(abs(r[0] - m[0]) for r, m in zip(real_s, model_s))
        n = len(diffs)
        same, common = order_agreement(real_s, model_s)
        print(f"slurmctld's StartTime - model (whole seconds): mean {sum(diffs) / n:.3f} s, p50 {diffs[n // 2]:.0f} s, "
              f"p99 {diffs[min(n - 1, int(n * 0.99))]:.0f} s, max {diffs[-1]:.0f} s, equal {sum(1 for d in diffs if d == 0)} of {n}")
        print(f"start order by StartTime, then job id: {same} of {n} in the same place ({100 * same / n:.1f}%), "
              f"{common} in the same relative order ({100 * common / n:.1f}%)")


if __name__ == "__main__":
    main()
