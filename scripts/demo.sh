#!/usr/bin/env bash
# The demo: installs build dependencies, builds, starts a 3-node local cluster running real jobs,
# kills its leader midway, shows that nothing was lost, and tears it down.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/corral-target}"
cargo build --release -p corral-node -p corral-cli
exec "$CARGO_TARGET_DIR/release/corral" demo "$@"
