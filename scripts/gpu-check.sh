#!/usr/bin/env bash
# One check of Corral on a real GPU machine, needing nothing but the built binaries (and, for
# the CUDA part, python with torch where the machine has it). It never changes the GPU's MIG
# mode and never resets it: it reads what is there.
#
#   scripts/gpu-check.sh [--bin DIR] [--gpus auto|SPEC] [--out DIR]
#
# --gpus auto (the default) discovers the GPUs with NVML; a simulated SPEC (h200-mig, h100:2)
# runs the same steps here without a GPU. Writes every step's output under --out (default
# $OUT, else ./gpu-check-out) and prints a summary; exits non-zero when a step that the
# machine can do fails.
set -uo pipefail
BIN="$(cd "$(dirname "$0")/.." && pwd)/target/release"
GPUS=auto
OUTDIR="${OUT:-$PWD/gpu-check-out}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN="$2"; shift 2 ;;
    --gpus) GPUS="$2"; shift 2 ;;
    --out) OUTDIR="$2"; shift 2 ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
done
CORRAL="$BIN/corral"
export CORRALD="$BIN/corrald"
[ -x "$CORRAL" ] && [ -x "$CORRALD" ] || { echo "gpu-check: no corral/corrald in $BIN (--bin DIR)" >&2; exit 2; }
mkdir -p "$OUTDIR"
DIR="$(mktemp -d /tmp/corral-gpu-check.XXXXXX)"
failed=()
step() { # step NAME COMMAND...: runs it, output to OUTDIR/NAME.txt, timed; a failure fails the check
  run_step "$@" || { failed+=("$1"); return 1; }
}
info() { # info NAME COMMAND...: as step, for what the machine says about itself (MIG off is no failure)
  run_step "$@"
}
run_step() {
  local name="$1"; shift
  local t0; t0=$(date +%s%N)
  "$@" > "$OUTDIR/$name.txt" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-22s rc=%-3s %6d ms\n' "$name" "$rc" "$ms" | tee -a "$OUTDIR/summary.txt"
  return "$rc"
}
cleanup() { "$CORRAL" dev down --dir "$DIR" >/dev/null 2>&1; cp "$DIR"/n1/corrald.log "$OUTDIR/corrald.log" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
: > "$OUTDIR/summary.txt"

# What the machine says about itself, before Corral.
if command -v nvidia-smi >/dev/null; then
  info nvidia-smi-q nvidia-smi -q -x
  info nvidia-smi-topo nvidia-smi topo -m
  info nvidia-smi-mig-mode nvidia-smi --query-gpu=index,name,uuid,mig.mode.current,mig.mode.pending,driver_version --format=csv
  info nvidia-smi-mig-lgip nvidia-smi mig -lgip
  info nvidia-smi-mig-lgi nvidia-smi mig -lgi
fi

# NVML discovery, topology and MIG as a node reads them (the node's start-up time included).
step dev-up "$CORRAL" dev up --dir "$DIR" --nodes 1 --voters-max 1 --gpus "$GPUS" --cpus 8 --memory-mib 65536 || { echo "gpu-check: the node did not start"; exit 1; }
step nodes "$CORRAL" --cluster "$DIR" --json nodes
grep -E "gpu|nvml|mig|topolog" "$DIR/n1/corrald.log" > "$OUTDIR/discovery-log.txt" 2>&1
step sinfo env CORRAL_CLUSTER="$DIR" "$CORRAL" slurm sinfo -N -o "%N %P %G %T"
step mig-show "$CORRAL" --cluster "$DIR" mig show

# A job that sees its GPU by UUID and runs a CUDA program: torch's NCCL all_reduce on one GPU
# where torch imports, else nvidia-smi -L from inside the job.
cat > "$DIR/job.sh" <<'EOF'
#!/bin/sh
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_JOB_GPUS=$SLURM_JOB_GPUS GPU_DEVICE_ORDINAL=$GPU_DEVICE_ORDINAL"
for f in /dev/nvidia[0-9]*; do
  if python3 -c 'import sys; open(sys.argv[1], "rb")' "$f" 2>/dev/null; then echo "open $f"; else echo "denied $f"; fi
done
command -v nvidia-smi >/dev/null && nvidia-smi -L
if python3 -c 'import torch' 2>/dev/null; then
  python3 - <<'PY'
import os, time, torch, torch.distributed as dist
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "devices", torch.cuda.device_count())
if torch.cuda.is_available():
    print("device 0:", torch.cuda.get_device_name(0))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("nccl", rank=0, world_size=1)
    x = torch.ones(1 << 26, device="cuda")
    t0 = time.time()
    for _ in range(20):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    print(f"nccl all_reduce 256 MiB x20: {time.time() - t0:.3f} s, sum ok: {bool((x == 1).all())}")
    dist.destroy_process_group()
    y = torch.randn(8192, 8192, device="cuda")
    t0, n = time.time(), 0
    while time.time() - t0 < 20:  # long enough for several of the node's 5 s GPU samples
        for _ in range(50):
            y = torch.nn.functional.normalize(y @ y, dim=1)
        torch.cuda.synchronize()
        n += 50
    print(f"fp32 8192^3 products: {n} in {time.time() - t0:.1f} s, {n * 2 * 8192**3 / (time.time() - t0) / 1e12:.1f} TFLOP/s")
PY
fi
EOF
chmod +x "$DIR/job.sh"
# A whole GPU, or where the GPU is in MIG mode the first instance it already has (the check
# never creates MIG instances: with MIG on and none made, no job runs).
gres=$("$CORRAL" --cluster "$DIR" --json mig show | python3 -c '
import json, sys
rows = json.load(sys.stdin)
if not rows: print("gpu:1")
elif rows[0]["layout"]: print("gpu:%s:1" % rows[0]["layout"][0])
')
echo "gres ${gres:-none: MIG mode is on with no instances}" | tee -a "$OUTDIR/summary.txt"
[ -n "$gres" ] || exit 1
job=$("$CORRAL" --cluster "$DIR" --json submit --gres "$gres" -c 4 --mem 32G -o "$DIR/job.out" -- "$DIR/job.sh" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
echo "job $job" >> "$OUTDIR/summary.txt"
# The DCGM-named gauges while it runs, from the node's metrics port: every 2 s until the job
# ends (at most 120 s), the GPU series of each scrape kept with its time, and the last scrape whole.
url="http://$(sed -n 's/^metrics_listen *= *"\(.*\)"/\1/p' "$DIR/n1/node.toml")/metrics"
scrape() { curl -fsS "$1" 2>/dev/null || python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
for _ in $(seq 60); do
  scrape "$url" > "$OUTDIR/metrics-last.txt" 2>&1
  { echo "# at $(date +%T)"; grep -E '^DCGM_|^corral_gpu' "$OUTDIR/metrics-last.txt"; } >> "$OUTDIR/metrics-during.txt"
  "$CORRAL" --cluster "$DIR" --json show "$job" > "$OUTDIR/job-show.txt" 2>&1
  grep -qE '"state": *"(COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL)"|cannot ever run' "$OUTDIR/job-show.txt" && break
  sleep 2
done
# The fence: a job given no GPU may not open the GPUs' device files (cgroup v2 device program
# or v1 devices controller), so CUDA finds no device whatever it is told.
cat > "$DIR/nogpu.sh" <<'EOF'
#!/bin/sh
for f in /dev/nvidia[0-9]*; do
  if python3 -c 'import sys; open(sys.argv[1], "rb")' "$f" 2>/dev/null; then echo "open $f"; else echo "denied $f"; fi
done
command -v nvidia-smi >/dev/null && nvidia-smi -L
CUDA_VISIBLE_DEVICES=0 python3 -c 'import torch; print("torch cuda available:", torch.cuda.is_available())' 2>&1 | tail -1
true
EOF
chmod +x "$DIR/nogpu.sh"
nogpu=$("$CORRAL" --cluster "$DIR" --json submit -c 1 --mem 4G -o "$DIR/nogpu.out" -- "$DIR/nogpu.sh" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
step nogpu-wait "$CORRAL" --cluster "$DIR" wait "$nogpu" --timeout 120
cp "$DIR/nogpu.out" "$OUTDIR/nogpu.out" 2>/dev/null
grep -E "device files|not fenced" "$DIR/n1/corrald.log" > "$OUTDIR/fence-log.txt" 2>&1
[ -e /dev/nvidia0 ] || echo "fence: no /dev/nvidia0 here, not checked" | tee -a "$OUTDIR/summary.txt"
[ -e /dev/nvidia0 ] && step fence sh -c "grep -q '^denied /dev/nvidia' '$DIR/nogpu.out' && ! grep -q '^open /dev/nvidia' '$DIR/nogpu.out' && grep -q '^open /dev/nvidia' '$DIR/job.out'"
step job-wait "$CORRAL" --cluster "$DIR" wait "$job" --timeout 30
cp "$DIR/job.out" "$OUTDIR/job.out" 2>/dev/null
step job-show "$CORRAL" --cluster "$DIR" --json show "$job"
step sacct env CORRAL_CLUSTER="$DIR" "$CORRAL" slurm sacct -j "$job" -X -P -o JobID,State,ExitCode,Elapsed,AllocTRES,GPUSeconds

# XID and ECC as the machine reports them (the node's health watcher reads the same).
if command -v nvidia-smi >/dev/null; then
  info ecc nvidia-smi -q -d ECC
  info xid sh -c 'dmesg 2>/dev/null | grep -i xid | tail -20; journalctl -k --no-pager 2>/dev/null | grep -i xid | tail -20; true'
fi

echo "outputs in $OUTDIR" | tee -a "$OUTDIR/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" | tee -a "$OUTDIR/summary.txt"
  exit 1
fi
