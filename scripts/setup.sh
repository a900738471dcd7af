#!/usr/bin/env bash
# Installs what building Corral needs on Debian/Ubuntu (RocksDB's bindings need libclang and a
# C++ compiler). Idempotent: does nothing when everything is already there.
set -euo pipefail
need=()
command -v cargo >/dev/null || { echo "setup: cargo not found; install Rust (https://rustup.rs) first" >&2; exit 1; }
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v clang >/dev/null || need+=(clang)
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
command -v systemd-analyze >/dev/null || need+=(systemd)   # deploy tests verify the unit
command -v tmux >/dev/null || need+=(tmux)                 # salloc is tested at a terminal
if [ "$(id -u)" -eq 0 ]; then                              # the host rig (tests/tests/rig.rs, root only)
  command -v systemd-nspawn >/dev/null || need+=(systemd-container)
  command -v debootstrap >/dev/null || need+=(debootstrap)
  command -v nft >/dev/null || need+=(nftables)
  command -v curl >/dev/null || need+=(curl)
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
