#!/usr/bin/env bash
# Scheduling quality (not part of the test suite): `corral replay` on the public traces beside
# the clone (../shared/traces, or TRACES=DIR), Corral against the Slurm 22.05 model in one run.
#   scripts/replay.sh            the Philly week at loads 0.79 / 1.05 / 1.58 and FGD's placement
#   scripts/replay.sh philly     the Philly week only
#   scripts/replay.sh openb      FGD's placement on every openb pod list, seeds 42-51
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/corral-target}"
# The whole workspace, as the tests build it (one RocksDB build for both).
cargo build --release --workspace --bins
corral="$CARGO_TARGET_DIR/release/corral"
traces="${TRACES:-../shared/traces}"
if [ ! -d "$traces" ]; then
  echo "replay: no traces at $traces (set TRACES=DIR)" >&2
  exit 2
fi
what="${1:-all}"
out="${OUT:-/var/tmp/corral-replay}"
mkdir -p "$out"
if [ "$what" = all ] || [ "$what" = philly ]; then
  week="$traces/philly/slices/philly_week_2017-10-22.csv"
  for nodes in 128 96 64; do
    echo "== Philly week on $nodes nodes x 8 GPUs"
    "$corral" replay philly "$week" --nodes "$nodes" --gpus h100:8 \
      --policies corral,slurm-22.05,slurm-22.05-tuned --plot "$out/philly-week-$nodes.svg"
  done
fi
if [ "$what" = all ] || [ "$what" = openb ]; then
  dir="$traces/alibaba-openb-fgd"
  for list in default gpushare100 multigpu50 gpuspec33; do
    echo "== openb $list, 130%, seeds ${SEEDS:-42-51}"
    "$corral" replay openb "$dir/openb_pod_list_$list.csv" --inventory "$dir/openb_node_list_gpu_node.csv" \
      --inflate 1.3 --seeds "${SEEDS:-42-51}" --policies corral,slurm-22.05 \
      --fgd-results "$dir/fgd-expected-results/analysis_allo_discrete.csv"
  done
fi
