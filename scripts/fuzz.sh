#!/usr/bin/env bash
# The cargo-fuzz targets in fuzz/ (libFuzzer, nightly Rust), each for FUZZ_SECONDS (default 15):
# envelope, command, response (the wire and log decoder), sbatch (#SBATCH scripts), hostlist.
# Installs cargo-fuzz when missing. Without a nightly toolchain it says so and exits 0: the same
# entry points are fuzzed on stable by `cargo test --workspace --test fuzz_smoke`.
# A crash leaves its input in fuzz/artifacts/TARGET/; repeat it with
#   (cd fuzz && cargo +nightly fuzz run TARGET artifacts/TARGET/crash-...)
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-15}"
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz.sh: no nightly toolchain here; libFuzzer targets skipped (fuzz_smoke still runs on stable)"
  exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
export CARGO_TARGET_DIR="${CORRAL_FUZZ_TARGET_DIR:-/var/tmp/corral-fuzz-target}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for target in envelope command response sbatch hostlist; do
  echo "fuzz.sh: $target for ${seconds}s"
  status=0
  cargo +nightly fuzz run -O "$target" -- -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 >"$log" 2>&1 || status=$?
  grep -E '^(Done|==[0-9]+==|SUMMARY|stat::number_of_executed_units)' "$log" || true
  if [ "$status" != 0 ]; then
    tail -40 "$log" >&2
    echo "fuzz.sh: $target failed (exit $status); inputs that crash are in fuzz/artifacts/$target/" >&2
    exit 1
  fi
done
