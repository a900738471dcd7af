#!/usr/bin/env bash
# The host rig: N booted Debian hosts (systemd-nspawn containers, each with its own systemd,
# journald, hostname, machine-id and address on a bridge), Corral installed on each by
# deploy/install.sh, the cluster formed with join tokens and corrald run by systemd; faults
# injected from outside the daemons (nftables on the bridge, the cgroup freezer, SIGKILL of a
# host's PID 1).
#
#   scripts/hosts.sh up N DIR            boot N hosts h1..hN, install, form the cluster, write DIR/client.toml
#   scripts/hosts.sh exec DIR HOST -- CMD...   run CMD inside HOST (as root, in all its namespaces)
#   scripts/hosts.sh fault DIR KIND ARGS...    isolate H | partition A[,B..] C[,D..] | oneway A B
#                                        | loss PCT A B | latency MS A[,B..] C[,D..] | slow-disk IOPS H
#                                        | skew SECS H | freeze H | thaw H | crash H | reboot H
#                                        | poweroff-all | fail-disk write|all H
#   scripts/hosts.sh install DIR HOST...  install the build on HOST again with deploy/install.sh
#   scripts/hosts.sh boot DIR HOST...     start hosts that are down (after crash or poweroff-all)
#   scripts/hosts.sh heal DIR             clear every network and disk fault, thaw and boot every host
#   scripts/hosts.sh status DIR           each host: running or down, frozen, corrald's state
#   scripts/hosts.sh wait-up DIR          wait until `corral nodes` lists every host UP (60 s at most)
#   scripts/hosts.sh down DIR             stop every host, remove rules, mounts and the bridge
#   scripts/hosts.sh setup                install what the rig needs, build the root file system
#
# The root file system is built once per machine outside the clone (CORRAL_RIG, default
# /var/tmp/corral-rig); the build installed is the one scripts/test.sh makes
# ($CARGO_TARGET_DIR/debug, or CORRAL_BIN_DIR). Needs root. Simulated GPUs: h100:8 a host
# (CORRAL_RIG_GPUS). Latency without netem: an NFQUEUE delayer (scripts/rig-delay.py) in each
# sender's network namespace. DIR/shared is mounted in every host at its own path, as a
# cluster's shared file system is. A failing disk (CORRAL_RIG_FAULT_DISK=1 at `up`): each host's
# /var/lib/corral is a FUSE layer (scripts/rig-faultfs.py, fusepy) that `fail-disk` turns to
# EIO. A slow disk: the host's blkio cgroup throttles its I/O. Clock
# skew: a time namespace per host (its clocks since boot; Linux has no per-namespace wall clock).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
rig="${CORRAL_RIG:-/var/tmp/corral-rig}"
faultfs_venv="$rig/faultfs-venv"
bin_dir="${CORRAL_BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/corral-target}/debug}"
gpus="${CORRAL_RIG_GPUS:-h100:8}"
bridge=crl0
subnet=10.77.0
table=corral_rig
port=7100
# Names the directory of the rig that is up: one at a time (one bridge, one address range).
active=/run/corral-rig.dir
# The cgroup hierarchies each host gets a group of its own in: v1's systemd, freezer (`freeze`)
# and blkio (`slow-disk`), and v2, which nspawn gives each host as /sys/fs/cgroup/unified: in a
# shared v2 group, every host's systemd would use the same system.slice/corrald.service, and one
# host's restart of corrald would remove the others' job cgroups. Where this machine has no v2
# mounted, hosts.sh mounts it here.
cgroup2_mount=/run/corral-rig-cgroup2
hierarchies() {
  local v2
  v2="$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)"
  if [ -z "$v2" ]; then
    mkdir -p "$cgroup2_mount"
    mount -t cgroup2 none "$cgroup2_mount"
    v2="$cgroup2_mount"
  fi
  echo /sys/fs/cgroup/systemd /sys/fs/cgroup/freezer /sys/fs/cgroup/blkio "$v2"
}
python=/usr/bin/python3; [ -x "$python" ] || python="$(command -v python3 || echo python3)"

die() { echo "hosts.sh: $*" >&2; exit 1; }
say() { echo "hosts.sh: $*" >&2; }

need_root() { [ "$(id -u)" = 0 ] || die "needs root"; }

# Installs what the rig needs and builds the root file system once.
setup() {
  local missing=()
  command -v systemd-nspawn >/dev/null || missing+=(systemd-container)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v nft >/dev/null || missing+=(nftables)
  command -v iptables >/dev/null || missing+=(iptables)   # NFQUEUE for latency
  ldconfig -p | grep -q 'libfuse\.so\.2 ' || missing+=(libfuse2)   # the failing disk (fusepy)
  python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null
  fi
  mkdir -p "$rig"
  # One build at a time (two test runs at once).
  exec 9>"$rig/setup.lock"
  flock 9
  if [ ! -x "$rig/rootfs/lib/systemd/systemd" ]; then
    say "building the hosts' root file system in $rig/rootfs (once per machine)"
    rm -rf "$rig/rootfs.tmp"
    debootstrap --variant=minbase \
      --include=systemd,systemd-sysv,dbus,iproute2,procps,ca-certificates,util-linux,passwd,libstdc++6 \
      bookworm "$rig/rootfs.tmp" http://deb.debian.org/debian >"$rig/debootstrap.log" 2>&1 \
      || die "debootstrap failed: see $rig/debootstrap.log"
    mv "$rig/rootfs.tmp" "$rig/rootfs"
  fi
  if ! "$faultfs_venv/bin/python" -c 'import fuse' 2>/dev/null; then
    say "installing fusepy for the failing disk in $faultfs_venv"
    python3 -m venv "$faultfs_venv" && "$faultfs_venv/bin/pip" install -q fusepy==3.0.1 >/dev/null \
      || die "could not install fusepy into $faultfs_venv"
  fi
  exec 9>&-
}

# With CORRAL_RIG_FAULT_DISK=1 at `up`, each host's /var/lib/corral is a FUSE layer on this
# machine (scripts/rig-faultfs.py over DIR/hosts/H/disk.real) that `fault fail-disk` makes fail.
# It outlives the host's crashes and reboots, as a disk does.
fault_disk_up() {
  local dir="$1" h="$2" hd="$1/hosts/$2"
  mkdir -p "$hd/disk.real" "$hd/disk"
  mountpoint -q "$hd/disk" && return 0
  setsid "$faultfs_venv/bin/python" "$here/rig-faultfs.py" "$hd/disk.real" "$hd/disk" "$hd/disk.fail" \
    >"$hd/faultfs.log" 2>&1 </dev/null &
  local i
  for i in $(seq 1 100); do mountpoint -q "$hd/disk" && return 0; sleep 0.05; done
  die "the failing disk of $h did not mount: $(cat "$hd/faultfs.log")"
}

addr_of() { echo "$subnet.$((10 + ${1#h}))"; }
hosts_of() { cat "$1/hosts.list"; }
leader_pid() {
  # The host's PID 1 (systemd), the child of its nspawn.
  local pidfile="$1/hosts/$2/nspawn.pid"
  [ -s "$pidfile" ] || return 1
  local nspawn
  nspawn="$(cat "$pidfile")"
  [ -d "/proc/$nspawn" ] || return 1
  pgrep -P "$nspawn" | head -1
}

bridge_up() {
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
    ip addr add "$subnet.1/24" dev "$bridge"
  fi
  ip link set "$bridge" up
  nft list table bridge "$table" >/dev/null 2>&1 || nft -f - <<EOF
table bridge $table {
  chain forward { type filter hook forward priority 0; policy accept; }
  chain input { type filter hook input priority 0; policy accept; }
  chain output { type filter hook output priority 0; policy accept; }
}
EOF
}

# Prepares HOST's overlay: its own upper layer over the shared root, hostname, machine-id,
# address, names of the other hosts.
prepare() {
  local dir="$1" h="$2" all="$3"
  local hd="$dir/hosts/$h" m="$dir/hosts/$h/merged"
  mkdir -p "$hd/upper" "$hd/work" "$m" "$dir/shared"
  mountpoint -q "$m" || mount -t overlay overlay -o "lowerdir=$rig/rootfs,upperdir=$hd/upper,workdir=$hd/work" "$m"
  echo "$h" >"$m/etc/hostname"
  [ -s "$m/etc/machine-id" ] || tr -d '-' </proc/sys/kernel/random/uuid >"$m/etc/machine-id"
  mkdir -p "$m/etc/systemd/network" "$m/etc/systemd/system/multi-user.target.wants"
  printf '[Match]\nName=host0\n[Network]\nAddress=%s/24\n' "$(addr_of "$h")" >"$m/etc/systemd/network/10-host0.network"
  ln -sf /lib/systemd/system/systemd-networkd.service "$m/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
  { echo "127.0.0.1 localhost"; for o in $all; do echo "$(addr_of "$o") $o"; done; } >"$m/etc/hosts"
}

# Starts HOST: nspawn in a wrapper that starts it again after a reboot from inside (exit 133),
# in cgroups of its own (freezer: `freeze`), and waits until its systemd runs.
boot() {
  local dir="$1" h="$2"
  local hd="$dir/hosts/$h"
  if leader_pid "$dir" "$h" >/dev/null; then return 0; fi
  [ ! -e "$dir/fault-disk" ] || fault_disk_up "$dir" "$h"
  local roots c
  roots="$(hierarchies)"
  for c in $roots; do mkdir -p "$c/corral-rig/$h"; done
  rm -f "$hd/nspawn.pid"
  setsid bash -c '
    h="$1"; hd="$2"; m="$2/merged"; bridge="$3"; repo="$4"; bin="$5"; shared="$(cd "$2/../../shared" && pwd)"
    disk=(); [ -e "$2/../../fault-disk" ] && disk=(--bind="$2/disk:/var/lib/corral")
    for c in $6; do echo $$ >"$c/corral-rig/$h/cgroup.procs"; done
    while :; do
      # The host'"'"'s clocks since boot (CLOCK_MONOTONIC, CLOCK_BOOTTIME) run `skew` seconds ahead.
      skew="$(cat "$hd/skew" 2>/dev/null || echo 0)"
      unshare --time --monotonic="$skew" --boottime="$skew" systemd-nspawn -D "$m" --boot --register=no --keep-unit --network-bridge="$bridge" -M "$h" \
        --bind-ro="$repo/deploy:/opt/corral-src/deploy" --bind-ro="$bin:/opt/corral-bin" --bind="$shared:$shared" "${disk[@]}" \
        >>"$hd/console.log" 2>&1 </dev/null &
      echo $! >"$hd/nspawn.pid"
      wait $! && rc=0 || rc=$?
      echo "nspawn exited $rc" >>"$hd/console.log"
      [ "$rc" = 133 ] || break
    done
    rm -f "$hd/nspawn.pid"
  ' boot "$h" "$hd" "$bridge" "$repo" "$bin_dir" "$roots" >/dev/null 2>&1 </dev/null &
  local i
  for i in $(seq 1 200); do
    booted "$dir" "$h" && return 0
    sleep 0.1
  done
  die "$h did not boot within 20 s: see $hd/console.log"
}

# Whether HOST's systemd runs (or starts with its network up: corrald, Type=notify, may be
# waiting for a quorum that the next hosts to boot make, after poweroff-all).
booted() {
  local pid st
  pid="$(leader_pid "$1" "$2")" && [ -n "$pid" ] || return 1
  st="$(nsenter -t "$pid" -a systemctl is-system-running 2>/dev/null || true)"
  case "$st" in
    running|degraded) return 0 ;;
    starting) [ "$(nsenter -t "$pid" -a systemctl is-active systemd-networkd 2>/dev/null || true)" = active ] ;;
    *) return 1 ;;
  esac
}

# Waits until HOST's container is gone (its nspawn reaped), at most 10 s.
gone() {
  local i
  for i in $(seq 1 100); do
    [ -e "$1/hosts/$2/nspawn.pid" ] || return 0
    sleep 0.1
  done
  die "$2 still runs 10 s after its PID 1 was killed"
}

in_host() {
  local dir="$1" h="$2"
  shift 2
  local pid
  pid="$(leader_pid "$dir" "$h")" || die "$h is down"
  # In the host's cgroups too, as its own processes are (its freezer, its disk's throttle).
  (
    for c in $(hierarchies); do echo "$BASHPID" >"$c/corral-rig/$h/cgroup.procs" 2>/dev/null || true; done
    exec nsenter -t "$pid" -a "$@"
  )
}

# Installs the build on HOST with deploy/install.sh, as an operator would.
install_on() {
  in_host "$1" "$2" env PATH=/usr/sbin:/usr/bin:/sbin:/bin bash /opt/corral-src/deploy/install.sh --bin-dir /opt/corral-bin >/dev/null
}

wait_ready() {
  local dir="$1" h="$2" i
  for i in $(seq 1 600); do
    if [ "$(in_host "$dir" "$h" systemctl is-active corrald 2>/dev/null || true)" = active ]; then return 0; fi
    sleep 0.1
  done
  in_host "$dir" "$h" journalctl -u corrald --no-pager -n 30 >&2 || true
  die "corrald on $h is not active after 60 s"
}

# Whether the rig named in $active has a host that runs.
rig_running() {
  local other
  other="$(cat "$active" 2>/dev/null || true)"
  [ -n "$other" ] && [ -f "$other/hosts.list" ] || return 1
  for h in $(hosts_of "$other"); do leader_pid "$other" "$h" >/dev/null && return 0; done
  return 1
}

# Removes what a rig whose hosts are gone left behind: its rules, mounts, cgroups and bridge.
clear_stale() {
  local other
  other="$(cat "$active" 2>/dev/null || true)"
  if [ -n "$other" ] && [ -f "$other/hosts.list" ]; then (down "$other") || true; fi
  nft delete table bridge "$table" 2>/dev/null || true
  local c
  for c in $(hierarchies); do
    [ ! -d "$c/corral-rig" ] || find "$c/corral-rig" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  rm -f "$active"
}

up() {
  local n="$1" dir="$2"
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "up: N must be 1..99"
  need_root
  setup
  [ -x "$bin_dir/corrald" ] && [ -x "$bin_dir/corral" ] || die "no corrald/corral in $bin_dir: run 'cargo build --workspace --bins'"
  for c in systemd freezer blkio; do
    [ -e "/sys/fs/cgroup/$c/cgroup.procs" ] || die "no cgroup v1 $c hierarchy at /sys/fs/cgroup/$c: the rig needs it"
  done
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  # One rig at a time: wait for another that runs (CORRAL_RIG_WAIT_S, 600 s), clear one whose
  # hosts are all gone (its session ended without `down`: a killed test or chaos run).
  exec 8>/run/lock/corral-rig.lock
  flock 8
  local waited=0
  while rig_running; do
    [ "$waited" -lt "${CORRAL_RIG_WAIT_S:-600}" ] || die "a rig is up already ($(cat "$active")): scripts/hosts.sh down its DIR first"
    [ "$waited" -gt 0 ] || say "waiting for the rig in $(cat "$active") to go down"
    flock -u 8; sleep 5; waited=$((waited + 5)); flock 8
  done
  if [ -s "$active" ] || ip link show "$bridge" >/dev/null 2>&1; then
    say "clearing what a rig in $(cat "$active" 2>/dev/null || echo "?") left: none of its hosts runs"
    clear_stale
  fi
  echo "$dir" >"$active"
  exec 8>&-
  local all=""
  for i in $(seq 1 "$n"); do all="$all h$i"; done
  echo "$all" | tr ' ' '\n' | sed '/^$/d' >"$dir/hosts.list"
  if [ "${CORRAL_RIG_FAULT_DISK:-0}" = 1 ]; then touch "$dir/fault-disk"; else rm -f "$dir/fault-disk"; fi
  bridge_up
  local started=$SECONDS
  for h in $all; do
    prepare "$dir" "$h" "$all"
    boot "$dir" "$h"
  done
  say "booted $n hosts in $((SECONDS - started)) s"
  for h in $all; do install_on "$dir" "$h"; done
  local common=(--dir /etc/corral --gpus "$gpus" --socket /run/corral/corral.sock --runtime-dir /run/corral/jobs)
  in_host "$dir" h1 /usr/local/bin/corral cluster init "${common[@]}" --name h1 --listen "$(addr_of h1):$port" --json >"$dir/init.json"
  in_host "$dir" h1 systemctl enable --now corrald >/dev/null 2>&1
  wait_ready "$dir" h1
  for h in $all; do
    [ "$h" = h1 ] && continue
    local token
    token="$(in_host "$dir" h1 /usr/local/bin/corral cluster token create --ttl 10m)"
    in_host "$dir" "$h" /usr/local/bin/corral cluster join "${common[@]}" --token "$token" \
      --server "$(addr_of h1):$port" --name "$h" --listen "$(addr_of "$h"):$port" >/dev/null
    in_host "$dir" "$h" systemctl enable --now corrald >/dev/null 2>&1
    wait_ready "$dir" "$h"
  done
  # A client directory for this machine: root's certificate, every host as a server.
  in_host "$dir" h1 /usr/local/bin/corral cluster issue-client --dir /etc/corral --user root --out /root/rig-client >/dev/null
  rm -rf "$dir/client.tmp"
  cp -r "$dir/hosts/h1/merged/root/rig-client" "$dir/client.tmp"
  local servers
  servers="$(for h in $all; do printf '"%s:%s", ' "$(addr_of "$h")" "$port"; done | sed 's/, $//')"
  sed -i "s#^servers = .*#servers = [$servers]#" "$dir/client.tmp/client.toml"
  for f in "$dir"/client.tmp/*; do mv -f "$f" "$dir/"; done
  rmdir "$dir/client.tmp"
  say "cluster of $n hosts up: corral --cluster $dir nodes"
}

nft_rule() { nft add rule bridge "$table" "$1" "${@:2}"; }

fault() {
  local dir="$1" kind="$2"
  shift 2
  case "$kind" in
    isolate)
      for h in "$@"; do
        local a
        a="$(addr_of "$h")"
        for c in forward input output; do
          nft_rule "$c" ip saddr "$a" drop
          nft_rule "$c" ip daddr "$a" drop
        done
      done ;;
    partition)
      [ $# = 2 ] || die "partition A[,B..] C[,D..]"
      for a in ${1//,/ }; do for b in ${2//,/ }; do
        nft_rule forward ip saddr "$(addr_of "$a")" ip daddr "$(addr_of "$b")" drop
        nft_rule forward ip saddr "$(addr_of "$b")" ip daddr "$(addr_of "$a")" drop
      done; done ;;
    oneway)
      [ $# = 2 ] || die "oneway A B (A's packets to B are dropped)"
      nft_rule forward ip saddr "$(addr_of "$1")" ip daddr "$(addr_of "$2")" drop ;;
    loss)
      [ $# = 3 ] || die "loss PCT A B"
      nft_rule forward ip saddr "$(addr_of "$2")" ip daddr "$(addr_of "$3")" numgen random mod 100 "<" "$1" drop
      nft_rule forward ip saddr "$(addr_of "$3")" ip daddr "$(addr_of "$2")" numgen random mod 100 "<" "$1" drop ;;
    freeze|thaw)
      local state=FROZEN
      [ "$kind" = thaw ] && state=THAWED
      for h in "$@"; do echo "$state" >"/sys/fs/cgroup/freezer/corral-rig/$h/freezer.state"; done ;;
    crash)
      # Power cut of one host: its PID 1 and everything under it die at once; it stays down
      # until `boot`.
      for h in "$@"; do
        local pid
        pid="$(leader_pid "$dir" "$h")" || continue
        kill -KILL "$pid"
      done
      for h in "$@"; do gone "$dir" "$h"; done ;;
    reboot)
      for h in "$@"; do in_host "$dir" "$h" systemctl reboot >/dev/null 2>&1 || true; done ;;
    poweroff-all)
      for h in $(hosts_of "$dir"); do
        local pid
        pid="$(leader_pid "$dir" "$h")" && kill -KILL "$pid"
      done
      for h in $(hosts_of "$dir"); do gone "$dir" "$h"; done ;;
    latency)
      [ $# = 3 ] && [[ "$1" =~ ^[0-9]+$ ]] || die "latency MS A[,B..] C[,D..] (MS milliseconds each way)"
      delay "$dir" "$1" "$2" "$3"
      delay "$dir" "$1" "$3" "$2" ;;
    skew)
      # Linux namespaces no wall clock (CLOCK_REALTIME): a time namespace moves the clocks
      # since boot, which each real machine has of its own and the rig's hosts would share.
      [ $# -ge 2 ] && [[ "$1" =~ ^[0-9]+$ ]] || die "skew SECS H... (its clocks since boot SECS ahead, from a reboot)"
      local secs="$1" before=()
      shift
      for h in "$@"; do
        echo "$secs" >"$dir/hosts/$h/skew"
        before+=("$(cat "$dir/hosts/$h/nspawn.pid" 2>/dev/null || true)")
        in_host "$dir" "$h" systemctl reboot >/dev/null 2>&1 || true
      done
      local k=0
      for h in "$@"; do rebooted "$dir" "$h" "${before[$k]}"; k=$((k + 1)); done ;;
    slow-disk)
      [ $# -ge 2 ] && [[ "$1" =~ ^[1-9][0-9]*$ ]] || die "slow-disk IOPS H... (reads and writes a second)"
      local iops="$1" disk
      shift
      disk="$(disk_of "$dir")"
      for h in "$@"; do
        for f in read_iops_device write_iops_device; do
          echo "$disk $iops" >"/sys/fs/cgroup/blkio/corral-rig/$h/blkio.throttle.$f"
        done
      done ;;
    fail-disk)
      [ $# -ge 2 ] && [[ "$1" =~ ^(write|all)$ ]] || die "fail-disk write|all H... (EIO on writes, or on everything)"
      [ -e "$dir/fault-disk" ] || die "fail-disk needs the rig up with CORRAL_RIG_FAULT_DISK=1"
      local what="$1"
      shift
      for h in "$@"; do echo "$what" >"$dir/hosts/$h/disk.fail"; done ;;
    *) die "unknown fault '$kind'" ;;
  esac
}

# Waits until HOST runs again after a reboot from inside (its nspawn no longer OLD), at most 20 s.
rebooted() {
  local dir="$1" h="$2" old="$3" i
  for i in $(seq 1 200); do
    [ "$(cat "$dir/hosts/$h/nspawn.pid" 2>/dev/null || true)" != "$old" ] && booted "$dir" "$h" && return 0
    sleep 0.1
  done
  die "$h did not boot again within 20 s: see $dir/hosts/$h/console.log"
}

# The whole disk (MAJ:MIN) DIR's files are on: blkio throttles whole disks, not partitions.
disk_of() {
  local dev
  dev="$(stat -c '%Hd:%Ld' "$1")"
  [ -e "/sys/dev/block/$dev/partition" ] && dev="$(cat "/sys/dev/block/$dev/../dev")"
  [ -e "/sys/dev/block/$dev" ] || die "no block device under $1 ($dev): slow-disk needs one"
  echo "$dev"
}

# Each packet from the hosts of group FROM to those of group TO held MS milliseconds: an NFQUEUE
# rule in each sender's own network namespace (iptables: this kernel's nftables has no queue)
# and a delayer (rig-delay.py) in that namespace.
delay() {
  local dir="$1" ms="$2" from="$3" to="$4" h t
  mkdir -p "$dir/faults"
  for h in ${from//,/ }; do
    local pid q
    pid="$(leader_pid "$dir" "$h")" || die "$h is down"
    q=$(( $(cat "$dir/faults/queue.next" 2>/dev/null || echo 1) ))
    echo $((q + 1)) >"$dir/faults/queue.next"
    setsid nsenter -t "$pid" -n "$python" "$here/rig-delay.py" "$q" "$ms" >"$dir/faults/delay-$h-$q.log" 2>&1 </dev/null &
    echo $! >"$dir/faults/delay-$h-$q.pid"
    local i
    for i in $(seq 1 100); do grep -q '^bound' "$dir/faults/delay-$h-$q.log" && break; sleep 0.05; done
    grep -q '^bound' "$dir/faults/delay-$h-$q.log" || die "the delayer in $h did not start: $(cat "$dir/faults/delay-$h-$q.log")"
    for t in ${to//,/ }; do
      nsenter -t "$pid" -n iptables -t mangle -A OUTPUT -d "$(addr_of "$t")" -j NFQUEUE --queue-num "$q" --queue-bypass
    done
  done
}

# Clears latency and slow disks: the queue rules in each host, the delayers, the throttles.
undelay() {
  local dir="$1" h f
  for h in $(hosts_of "$dir"); do
    local pid
    if pid="$(leader_pid "$dir" "$h")"; then nsenter -t "$pid" -n iptables -t mangle -F OUTPUT 2>/dev/null || true; fi
    for f in /sys/fs/cgroup/blkio/corral-rig/$h/blkio.throttle.{read,write}_iops_device; do
      [ -e "$f" ] || continue
      awk '{print $1, 0}' "$f" | while read -r line; do echo "$line" >"$f"; done
    done
  done
  for f in "$dir"/faults/delay-*.pid; do
    [ -e "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
}

heal() {
  local dir="$1"
  nft flush chain bridge "$table" forward 2>/dev/null || true
  nft flush chain bridge "$table" input 2>/dev/null || true
  nft flush chain bridge "$table" output 2>/dev/null || true
  undelay "$dir"
  for h in $(hosts_of "$dir"); do
    [ -e "/sys/fs/cgroup/freezer/corral-rig/$h/freezer.state" ] && echo THAWED >"/sys/fs/cgroup/freezer/corral-rig/$h/freezer.state"
    leader_pid "$dir" "$h" >/dev/null || boot "$dir" "$h"
    # A disk that failed is replaced: corrald, which may have given up, starts again.
    if [ -e "$dir/hosts/$h/disk.fail" ]; then
      rm -f "$dir/hosts/$h/disk.fail"
      in_host "$dir" "$h" systemctl reset-failed corrald >/dev/null 2>&1 || true
      in_host "$dir" "$h" systemctl start --no-block corrald >/dev/null 2>&1 || true
    fi
  done
}

status() {
  local dir="$1"
  for h in $(hosts_of "$dir"); do
    local st="down" frozen="" svc="-"
    if pid="$(leader_pid "$dir" "$h")"; then
      st="up"
      [ "$(cat "/sys/fs/cgroup/freezer/corral-rig/$h/freezer.state" 2>/dev/null)" = FROZEN ] && frozen=" frozen"
      [ -z "$frozen" ] && svc="$(nsenter -t "$pid" -a systemctl is-active corrald 2>/dev/null || true)"
    fi
    printf '%-4s %-15s %s%s corrald=%s\n' "$h" "$(addr_of "$h")" "$st" "$frozen" "$svc"
  done
}

down() {
  local dir="$1"
  [ -f "$dir/hosts.list" ] || die "$dir holds no rig"
  nft delete table bridge "$table" 2>/dev/null || true
  undelay "$dir"
  for h in $(hosts_of "$dir"); do
    echo THAWED >"/sys/fs/cgroup/freezer/corral-rig/$h/freezer.state" 2>/dev/null || true
    local pid
    if pid="$(leader_pid "$dir" "$h")"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  for h in $(hosts_of "$dir"); do
    local i
    for i in $(seq 1 100); do [ -e "$dir/hosts/$h/nspawn.pid" ] || break; sleep 0.1; done
    # What a host's own layers hold mounted (the fault disk), then the host's root.
    { grep -o " $dir/hosts/$h/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  done
  # The hosts' cgroups, deepest first (each host's systemd made its own below).
  local c
  for c in $(hierarchies); do
    [ ! -d "$c/corral-rig" ] || find "$c/corral-rig" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  ! mountpoint -q "$cgroup2_mount" || umount "$cgroup2_mount" || true
  rmdir "$cgroup2_mount" 2>/dev/null || true
  ip link del "$bridge" 2>/dev/null || true
  [ "$(cat "$active" 2>/dev/null)" = "$dir" ] && rm -f "$active"
  local left
  left="$(leftovers "$dir")"
  [ -z "$left" ] || die "rig in $dir stopped, but left: $left"
  say "rig in $dir stopped (its files stay; rm -rf $dir removes them)"
}

# Waits until the cluster lists every host of DIR UP (after `heal`, say), asking from this machine.
wait_up() {
  local dir="$1" n i
  n="$(hosts_of "$dir" | wc -l)"
  for i in $(seq 1 300); do
    [ "$("$bin_dir/corral" --cluster "$dir" nodes 2>/dev/null | grep -c ' UP ')" = "$n" ] && return 0
    sleep 0.2
  done
  die "not every node of $dir is UP after 60 s"
}

# What a rig in DIR left on this machine: processes, mounts, cgroups, the bridge, rules.
leftovers() {
  local dir="$1" left=()
  for h in $(hosts_of "$dir"); do
    leader_pid "$dir" "$h" >/dev/null && left+=("$h running")
  done
  grep -q " $dir/hosts/" /proc/mounts && left+=("mounts under $dir/hosts")
  for c in /sys/fs/cgroup/systemd /sys/fs/cgroup/freezer /sys/fs/cgroup/blkio; do [ -d "$c/corral-rig" ] && left+=("cgroup $c/corral-rig"); done
  local v2
  v2="$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)"
  [ -n "$v2" ] && [ -d "$v2/corral-rig" ] && left+=("cgroup $v2/corral-rig")
  for f in "$dir"/faults/*.pid; do
    [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && left+=("delayer $(basename "$f" .pid)")
  done
  ip link show "$bridge" >/dev/null 2>&1 && left+=("bridge $bridge")
  nft list table bridge "$table" >/dev/null 2>&1 && left+=("nft table $table")
  echo "${left[*]}"
}

cmd="${1:-}"
[ $# -ge 1 ] && shift
case "$cmd" in
  up) [ $# = 2 ] || die "up N DIR"; up "$1" "$2" ;;
  exec)
    [ $# -ge 4 ] && [ "$3" = -- ] || die "exec DIR HOST -- CMD..."
    dir="$1" h="$2"; shift 3; in_host "$dir" "$h" "$@" ;;
  fault) [ $# -ge 2 ] || die "fault DIR KIND ARGS..."; need_root; fault "$@" ;;
  boot) [ $# -ge 2 ] || die "boot DIR HOST..."; d="$1"; shift; for h in "$@"; do boot "$d" "$h"; done ;;
  install) [ $# -ge 2 ] || die "install DIR HOST..."; d="$1"; shift; for h in "$@"; do install_on "$d" "$h"; done ;;
  setup) need_root; setup ;;
  heal) [ $# = 1 ] || die "heal DIR"; need_root; heal "$1" ;;
  status) [ $# = 1 ] || die "status DIR"; status "$1" ;;
  wait-up) [ $# = 1 ] || die "wait-up DIR"; wait_up "$1" ;;
  down) [ $# = 1 ] || die "down DIR"; need_root; down "$1" ;;
  *) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; [ -z "$cmd" ] || exit 2 ;;
esac
