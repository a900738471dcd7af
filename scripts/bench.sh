#!/usr/bin/env bash
# Benchmarks (not part of the test suite): the cluster (submit throughput and latency,
# submit-to-running, leader failover) against this machine's fdatasync, and the scheduler.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/corral-target}"
cargo build --release -p corral-node -p corral-cli
"$CARGO_TARGET_DIR/release/corral" bench "$@"
