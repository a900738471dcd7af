#!/usr/bin/env bash
# Leader failover on the host rig (scripts/hosts.sh), measured as a user sees it: the time from
# a fault of the leader's host to the next submission committed by the cluster.
#
#   scripts/rig-failover.sh DIR KIND N     KIND: crash | isolate | oneway | freeze
#
# crash: SIGKILL of the leader host's PID 1 (power cut); isolate: every packet to and from it
# dropped; oneway: its packets to the others dropped (it still hears them); freeze: its cgroup
# frozen. After each sample the rig is healed and every node is UP again before the next.
# CORRAL_RIG_LATENCY="MS A[,B..] C[,D..]" holds the hosts in racks with MS each way between them
# (`hosts.sh fault latency`), set again after each heal. Prints one line a sample and then min,
# median, p90 and max in milliseconds.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:?DIR}" kind="${2:?KIND}" n="${3:-10}"
corral="${CORRAL_BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/corral-target}/debug}/corral"
samples=()

racks() {
  [ -z "${CORRAL_RIG_LATENCY:-}" ] || scripts/hosts.sh fault "$dir" latency $CORRAL_RIG_LATENCY
}

scripts/hosts.sh wait-up "$dir"
racks
for i in $(seq 1 "$n"); do
  leader="$("$corral" --cluster "$dir" cluster --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader"])')"
  others="$(grep -vx "$leader" "$dir/hosts.list")"
  t0=$(date +%s%N)
  case "$kind" in
    crash|isolate|freeze) scripts/hosts.sh fault "$dir" "$kind" "$leader" ;;
    oneway) for o in $others; do scripts/hosts.sh fault "$dir" oneway "$leader" "$o"; done ;;
    *) echo "rig-failover: unknown kind $kind" >&2; exit 2 ;;
  esac
  until job="$(timeout 10 "$corral" --cluster "$dir" submit --mem 64M -- true 2>/dev/null)"; do :; done
  t1=$(date +%s%N)
  ms=$(( (t1 - t0) / 1000000 ))
  samples+=("$ms")
  now="$("$corral" --cluster "$dir" cluster --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["leader"], d["term"])')"
  echo "$kind of $leader: job $job committed after $ms ms (leader now: $now)"
  scripts/hosts.sh heal "$dir" >/dev/null
  scripts/hosts.sh wait-up "$dir"
  racks
  sleep 2
done
printf '%s\n' "${samples[@]}" | sort -n | awk -v k="$kind" '{v[NR]=$1} END {
  p90 = v[int((NR * 9 + 9) / 10)]; if (p90 == "") p90 = v[NR];
  printf "%s: %d samples, min %d ms, median %d ms, p90 %d ms, max %d ms\n", k, NR, v[1], v[int((NR + 1) / 2)], p90, v[NR] }'
