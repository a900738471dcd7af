#!/usr/bin/env bash
# The client tests too heavy for the default suite: train_fsdp.sbatch exactly as written (4 nodes,
# 8 torch workers each: 36 torch processes on one host) and deepspeed_zero3.sbatch exactly as
# written (2 nodes of 8 ranks). Needs what scripts/test.sh builds.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup-clients.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/corral-target}"
cargo build --workspace --bins
# --workspace: a single package's build resolves RocksDB's features differently and compiles its
# C++ again.
cargo test --workspace --test clients -- --ignored --test-threads 1 --nocapture
