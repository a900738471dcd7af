#!/usr/bin/env bash
# The test command: installs build dependencies, builds every binary, runs every test.
# A warm target directory outside the clone (CARGO_TARGET_DIR) spares rebuilding RocksDB.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The real programs of the client tests (torch, Lightning, submitit, dask-jobqueue) in a venv
# outside the clone (CORRAL_PYENV), downloaded once per machine.
scripts/setup-clients.sh
# The host rig's root file system (tests/tests/rig.rs), built once per machine outside the clone
# (CORRAL_RIG); only as root, who alone can boot hosts.
[ "$(id -u)" -ne 0 ] || scripts/hosts.sh setup
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/corral-target}"
export CARGO_TERM_COLOR=never
cargo build --workspace --bins
cargo test --workspace -- --test-threads 2
# libFuzzer on the wire decoder and the #SBATCH parser, 15 s a target (needs nightly).
FUZZ_SECONDS="${FUZZ_SECONDS:-15}" scripts/fuzz.sh
