#!/usr/bin/env bash
# The demo: installs build dependencies, builds, starts a 3-node local cluster running real jobs,
# kills its leader midway, shows that nothing was lost, and tears it down.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/corral-target}"
# The build `scripts/test.sh` makes (same profile, same features): RocksDB's C++ is compiled
# once for both commands.
cargo build --workspace --bins
exec "$CARGO_TARGET_DIR/debug/corral" demo "$@"
