#!/usr/bin/env bash
# A rolling upgrade on the host rig (scripts/hosts.sh), as an operator does it: corral-restd
# enabled on h1, long jobs running on every host, then host by host the build reinstalled with
# deploy/install.sh and the runs handed over (`systemctl kill --signal=SIGUSR2 --kill-whom=main
# corrald`; corrald exits 75 and systemd starts the new build).
#
#   scripts/rig-upgrade.sh DIR [JOBS]      DIR: a rig of `scripts/hosts.sh up`; JOBS: 6 by default
#
# Prints, and writes to DIR/upgrade.jsonl, one line a host: new corrald active after SIGUSR2
# (systemd's ActiveEnterTimestamp), node UP after SIGUSR2 (first `corral nodes` on the host, so
# answered by the new daemon, that lists it UP), jobs that kept their processes (same pids),
# jobs requeued, and for h1 the restd pings that failed while its corrald restarted (one ping
# every 100 ms from just before its SIGUSR2 until 2 s after it is UP) and the time from the first
# failed ping to the next answer. The jobs are cancelled at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(cd "${1:?DIR}" && pwd)"
njobs="${2:-6}"
corral="${CORRAL_BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/corral-target}/debug}/corral"
hosts=($(cat "$dir/hosts.list"))
addr_of() { echo "10.77.0.$((10 + ${1#h}))"; }
h() { scripts/hosts.sh exec "$dir" "$1" -- "${@:2}"; }
now_us() { echo "${EPOCHREALTIME/./}"; }
die() { echo "rig-upgrade: $*" >&2; exit 1; }
out="$dir/upgrade.jsonl"
: >"$out"

# The client certificate hosts.sh wrote for this machine (root's).
tls() { sed -n "s/^$1 = \"\(.*\)\"/\1/p" "$dir/client.toml"; }
cacert="$dir/$(tls ca_cert)" cert="$dir/$(tls cert)" key="$dir/$(tls key)"
restd_ping() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 2 --cacert "$cacert" --cert "$cert" --key "$key" \
    --resolve "h1:6820:$(addr_of h1)" https://h1:6820/slurm/v0.0.38/ping 2>/dev/null || true
}

# The pid of each job's process (the `sleep` it execs), by job id, on its host.
job_pids() {
  local line
  for line in "${jobs[@]}"; do
    set -- $line
    printf '%s %s %s\n' "$1" "$2" "$(h "$2" pgrep -xf "sleep $3" | tr '\n' ' ' | sed 's/ $//')"
  done
}

# 1. corral restd under systemd on h1, timed to its first answer.
t0=$(now_us)
h h1 systemctl enable --now corral-restd >/dev/null 2>&1
until [ "$(restd_ping)" = 200 ]; do
  [ $(( $(now_us) - t0 )) -lt 20000000 ] || die "restd on h1 did not answer within 20 s"
  sleep 0.02
done
restd_first_ms=$(( ($(now_us) - t0) / 1000 ))
echo "restd on h1: first answer $restd_first_ms ms after systemctl enable --now"

# 2. Long jobs through the Slurm shims, spread over the hosts; each execs a sleep of its own length.
jobs=()
for i in $(seq 1 "$njobs"); do
  host="${hosts[$(( (i - 1) % ${#hosts[@]} ))]}"
  from="${hosts[$(( i % ${#hosts[@]} ))]}"
  secs=$((36000 + i))
  id="$(h "$from" /usr/local/libexec/corral/slurm/sbatch --parsable -w "$host" -c 1 --mem 64M -o /dev/null \
    --wrap "exec sleep $secs")"
  jobs+=("$id $host $secs")
done
deadline=$((SECONDS + 30))
until [ "$(job_pids | awk 'NF == 3' | wc -l)" = "$njobs" ]; do
  [ $SECONDS -lt $deadline ] || { job_pids >&2; die "not every job runs 30 s after submission"; }
  sleep 0.1
done
before="$(job_pids)"
echo "$njobs jobs running: $(echo "$before" | awk '{printf "%s on %s (pid %s); ", $1, $2, $3}')"

requeued() {
  "$corral" --cluster "$dir" --json queue | python3 -c '
import json, sys
ids = set(sys.argv[1:])
jobs = [j for j in json.load(sys.stdin) if str(j["id"]) in ids]
print(sum(1 for j in jobs if j["restart_count"] > 0 or j["run"] > 1 or j["state"] != "RUNNING"))' "${jobs[@]%% *}"
}

# 3. Host by host: install, hand over, wait until the new daemon is active and the node UP.
for host in "${hosts[@]}"; do
  scripts/hosts.sh install "$dir" "$host"
  old_pid="$(h "$host" systemctl show -p MainPID --value corrald)"
  pinger=""
  if [ "$host" = h1 ]; then
    (while :; do echo "$(now_us) $(restd_ping)"; sleep 0.1; done) >"$dir/pings.log" 2>/dev/null &
    pinger=$!
    sleep 0.3
  fi
  t_sig=$(now_us)
  h "$host" systemctl kill --signal=SIGUSR2 --kill-whom=main corrald
  # Polled inside the host, where each look costs a few ms (the same wall clock as here).
  up_at="$(h "$host" timeout 60 bash -c '
    until [ "$(systemctl show -p MainPID --value corrald)" != "$1" ] && [ "$(systemctl is-active corrald)" = active ]; do
      sleep 0.01
    done
    until /usr/local/bin/corral nodes 2>/dev/null | grep -Eq "^$2 +UP "; do sleep 0.01; done
    echo "${EPOCHREALTIME/./}"' poll "$old_pid" "$host")" || die "$host: no new corrald active and UP 60 s after SIGUSR2"
  active_at="$(h "$host" systemctl show -p ActiveEnterTimestamp --value --timestamp=us+utc corrald)"
  active_ms=$(( ($(date -d "$active_at" +%s%6N) - t_sig) / 1000 ))
  up_ms=$(( (up_at - t_sig) / 1000 ))
  failed_pings=null restd_gap_ms=null
  if [ -n "$pinger" ]; then
    sleep 2
    kill "$pinger"
    wait "$pinger" 2>/dev/null || true
    failed_pings="$(awk -v t="$t_sig" '$1 >= t && $2 != 200' "$dir/pings.log" | wc -l)"
    # From the first failed ping to the next answer.
    restd_gap_ms="$(awk -v t="$t_sig" '$1 >= t && $2 != 200 && !f { f = $1 } f && $2 == 200 { print int(($1 - f) / 1000); exit }
      END { if (!f) print 0 }' "$dir/pings.log")"
  fi
  now="$(job_pids)"
  kept="$(join <(echo "$before" | sort) <(echo "$now" | sort) | awk '$3 == $5 && $3 != ""' | wc -l)"
  req="$(requeued)"
  printf '%s: new corrald active %d ms, node UP %d ms after SIGUSR2; %d of %d jobs kept their processes, %d requeued or not running%s\n' \
    "$host" "$active_ms" "$up_ms" "$kept" "$njobs" "$req" "$([ "$failed_pings" = null ] || echo "; restd: $failed_pings failed pings, $restd_gap_ms ms without answers")"
  printf '{"host":"%s","active_ms":%d,"up_ms":%d,"kept":%d,"jobs":%d,"requeued":%d,"failed_pings":%s,"restd_gap_ms":%s,"restd_first_ms":%d}\n' \
    "$host" "$active_ms" "$up_ms" "$kept" "$njobs" "$req" "$failed_pings" "$restd_gap_ms" "$restd_first_ms" >>"$out"
done
for line in "${jobs[@]}"; do "$corral" --cluster "$dir" cancel "${line%% *}" >/dev/null; done
