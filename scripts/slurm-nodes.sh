#!/usr/bin/env bash
# A real Slurm 22.05 cluster of N nodes on this host, to check `corral replay`'s Slurm model
# against (scripts/replay-validate.py --slurm): slurmctld on a bridge, each slurmd in a network
# and UTS namespace of its own (node nN at 10.78.0.(10+N), hostname nN), 8 fake GPUs a node
# (inert character devices, as ../shared/peers/slurm does), CPUs and memory as configured
# (SlurmdParameters=config_overrides), start times from jobcomp/filetxt. Debian's packages
# (slurmctld, slurmd, munge), installed when missing. Needs root. Not part of the test suite.
#
#   scripts/slurm-nodes.sh up N DIR     start it; DIR/env.sh sets SLURM_CONF for the clients
#   scripts/slurm-nodes.sh down DIR     stop every daemon, remove the namespaces and bridge
set -euo pipefail

bridge=slv0
subnet=10.78.0
die() { echo "slurm-nodes.sh: $*" >&2; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  local n="$1" dir="$2"
  [[ "$n" =~ ^[1-9][0-9]?$ ]] || die "up: N must be 1..99"
  [ "$(id -u)" = 0 ] || die "needs root"
  local need=()
  for p in munge slurmctld slurmd slurm-client; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  mkdir -p "$dir"/{etc,run,log,state,spool,dev}
  # munge: the distro's key, our daemon (stopped by down when we started it).
  if [ ! -s /etc/munge/munge.key ]; then
    install -d -o munge -g munge -m 0700 /etc/munge
    runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
  fi
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge
  if ! alive /run/munge/munged.pid; then
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    for _ in $(seq 50); do alive /run/munge/munged.pid && break; sleep 0.1; done
    cp /run/munge/munged.pid "$dir/run/munged.pid"
  fi
  for g in 0 1 2 3 4 5 6 7; do [ -e "$dir/dev/nvidia$g" ] || mknod "$dir/dev/nvidia$g" c 195 "$g"; done
  local host
  host="$(hostname -s)"
  cat >"$dir/etc/slurm.conf" <<EOF
ClusterName=validate
SlurmctldHost=$host($subnet.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MinJobAge=3600
ReturnToService=2
EOF
  local i
  for i in $(seq 1 "$n"); do
    echo "NodeName=n$i NodeAddr=$subnet.$((10 + i)) CPUs=64 RealMemory=524288 Gres=gpu:h100:8 State=UNKNOWN" >>"$dir/etc/slurm.conf"
  done
  echo "PartitionName=gpu Nodes=n[1-$n] Default=YES MaxTime=INFINITE State=UP" >>"$dir/etc/slurm.conf"
  printf 'AutoDetect=off\nNodeName=n[1-%s] Name=gpu Type=h100 File=%s/dev/nvidia[0-7]\n' "$n" "$dir" >"$dir/etc/gres.conf"
  echo "export SLURM_CONF=$dir/etc/slurm.conf" >"$dir/env.sh"
  echo "$n" >"$dir/nodes"
  ip link add "$bridge" type bridge 2>/dev/null || true
  ip addr add "$subnet.1/24" dev "$bridge" 2>/dev/null || true
  ip link set "$bridge" up
  /usr/sbin/slurmctld -f "$dir/etc/slurm.conf"
  for i in $(seq 1 "$n"); do
    ip netns add "slv-n$i"
    ip link add "slv$i" type veth peer name eth0 netns "slv-n$i"
    ip link set "slv$i" master "$bridge" up
    ip netns exec "slv-n$i" ip link set lo up
    ip netns exec "slv-n$i" ip addr add "$subnet.$((10 + i))/24" dev eth0
    ip netns exec "slv-n$i" ip link set eth0 up
    # nsenter, not `ip netns exec`, which mounts a sysfs of its own without the cgroups.
    nsenter --net="/run/netns/slv-n$i" unshare --uts sh -c "hostname n$i; exec /usr/sbin/slurmd -f $dir/etc/slurm.conf"
  done
  export SLURM_CONF="$dir/etc/slurm.conf"
  for _ in $(seq 300); do
    [ "$(sinfo -h -o '%T %D' 2>/dev/null | awk '$1 == "idle" { print $2 }')" = "$n" ] && return 0
    sleep 0.2
  done
  sinfo >&2 || true
  die "the $n nodes are not idle after 60 s: see $dir/log"
}

down() {
  local dir="$1" n
  [ -f "$dir/nodes" ] || die "$dir holds no cluster"
  n="$(cat "$dir/nodes")"
  for pf in "$dir"/run/slurmd-*.pid "$dir/run/slurmctld.pid" "$dir/run/munged.pid"; do
    alive "$pf" && kill -TERM "$(cat "$pf")"
  done
  for i in $(seq 1 "$n"); do ip netns del "slv-n$i" 2>/dev/null || true; done
  ip link del "$bridge" 2>/dev/null || true
}

case "${1:-}" in
  up) [ $# = 3 ] || die "up N DIR"; up "$2" "$3" ;;
  down) [ $# = 2 ] || die "down DIR"; down "$2" ;;
  *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
