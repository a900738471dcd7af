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
step() { # step NAME COMMAND...: runs it, output to OUTDIR/NAME.txt, timed
  local name="$1"; shift
  local t0; t0=$(date +%s%N)
  "$@" > "$OUTDIR/$name.txt" 2>&1
  local rc=$?
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-22s rc=%-3s %6d ms\n' "$name" "$rc" "$ms" | tee -a "$OUTDIR/summary.txt"
  [ "$rc" -eq 0 ] || failed+=("$name")
  return "$rc"
}
cleanup() { "$CORRAL" dev down --dir "$DIR" >/dev/null 2>&1; cp "$DIR"/n1/corrald.log "$OUTDIR/corrald.log" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
: > "$OUTDIR/summary.txt"

# What the machine says about itself, before Corral.
if command -v nvidia-smi >/dev/null; then
  step nvidia-smi-q nvidia-smi -q -x
  step nvidia-smi-topo nvidia-smi topo -m
  step nvidia-smi-mig-lgip nvidia-smi mig -lgip
  step nvidia-smi-mig-lgi nvidia-smi mig -lgi
fi

# NVML discovery, topology and MIG as a node reads them (the node's start-up time included).
step dev-up "$CORRAL" dev up --dir "$DIR" --nodes 1 --voters-max 1 --gpus "$GPUS" --cpus 8 --memory-mib 65536 || { echo "gpu-check: the node did not start"; exit 1; }
step nodes "$CORRAL" --cluster "$DIR" --json nodes
grep -E "gpu|nvml|mig|topolog" "$DIR/n1/corrald.log" > "$OUTDIR/discovery-log.txt" 2>&1
step sinfo env CORRAL_CLUSTER="$DIR" "$CORRAL" slurm sinfo -N -o "%N %G %T"

# A job that sees its GPU by UUID and runs a CUDA program: torch's NCCL all_reduce on one GPU
# where torch imports, else nvidia-smi -L from inside the job.
cat > "$DIR/job.sh" <<'EOF'
#!/bin/sh
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES SLURM_JOB_GPUS=$SLURM_JOB_GPUS GPU_DEVICE_ORDINAL=$GPU_DEVICE_ORDINAL"
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
    for _ in range(200):
        y = y @ y / 8192 ** 0.5
    torch.cuda.synchronize()
PY
fi
sleep 5
EOF
chmod +x "$DIR/job.sh"
job=$("$CORRAL" --cluster "$DIR" --json submit --gres gpu:1 -o "$DIR/job.out" -- "$DIR/job.sh" | python3 -c 'import json,sys; print(json.load(sys.stdin)["job_id"])')
echo "job $job" >> "$OUTDIR/summary.txt"
# DCGM-named gauges while it runs, from the node's metrics port.
url=$("$CORRAL" dev up --dir "$DIR" --nodes 1 --voters-max 1 --gpus "$GPUS" 2>/dev/null | sed -n 's/^n1 metrics: //p')
for i in 1 2 3; do
  sleep 2
  curl -fsS "$url" > "$OUTDIR/metrics-$i.txt" 2>&1 || python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('$url').read().decode())" > "$OUTDIR/metrics-$i.txt" 2>&1
done
step job-wait "$CORRAL" --cluster "$DIR" wait "$job" --timeout 300
cp "$DIR/job.out" "$OUTDIR/job.out" 2>/dev/null
step job-show "$CORRAL" --cluster "$DIR" --json show "$job"
step sacct env CORRAL_CLUSTER="$DIR" "$CORRAL" slurm sacct -j "$job" -X -P -o JobID,State,ExitCode,AllocTRES

# XID and ECC as the machine reports them (the node's health watcher reads the same).
if command -v nvidia-smi >/dev/null; then
  step ecc nvidia-smi -q -d ECC
  step xid sh -c 'dmesg 2>/dev/null | grep -i xid | tail -20; journalctl -k --no-pager 2>/dev/null | grep -i xid | tail -20; true'
fi

echo "outputs in $OUTDIR" | tee -a "$OUTDIR/summary.txt"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed: ${failed[*]}" | tee -a "$OUTDIR/summary.txt"
  exit 1
fi
