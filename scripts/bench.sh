#!/usr/bin/env bash
# Benchmarks (not part of the test suite): the cluster (submit throughput and latency,
# submit-to-running, leader failover) against this machine's fdatasync, and the scheduler.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/corral-target}"
# The whole workspace, as the tests build it: building single packages resolves other features
# for RocksDB's build and compiles its C++ again (~20 minutes on 2 cores).
cargo build --release --workspace --bins
"$CARGO_TARGET_DIR/release/corral" bench "$@"
