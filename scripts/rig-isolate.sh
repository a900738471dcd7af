#!/usr/bin/env bash
# A host cut off with a job running, on the host rig (scripts/hosts.sh): when the host's own run
# stops (it fences itself), and when the job runs again on another host. Watched as processes:
# `pgrep` inside each host, every 20 ms.
#
#   scripts/rig-isolate.sh DIR KIND N     KIND: isolate | oneway;  N samples
#
# isolate: every packet to and from the host dropped; oneway: its packets to the others dropped
# (it still hears them). Samples alternate between the leader's host and another one. In each,
# fillers (`sbatch -w`, every CPU of a host) hold every host but the target and a spare, the
# job (`--requeue`, every CPU of a host) so lands on the target, then the spare's filler is
# cancelled and the fault injected: the job can only run again on the spare. Prints one line a
# sample (and appends it as JSON to DIR/isolate.jsonl), then min, median and max a role.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="$(cd "${1:?DIR}" && pwd)" kind="${2:?KIND}" n="${3:-6}"
case "$kind" in isolate | oneway) ;; *) echo "rig-isolate: unknown kind $kind" >&2; exit 2 ;; esac
corral="${CORRAL_BIN_DIR:-${CARGO_TARGET_DIR:-/var/tmp/corral-target}/debug}/corral"
hosts=($(cat "$dir/hosts.list"))
[ "${#hosts[@]}" -ge 3 ] || { echo "rig-isolate: needs 3 hosts or more" >&2; exit 2; }
cpus="$(scripts/hosts.sh exec "$dir" "${hosts[0]}" -- nproc)"
h() { scripts/hosts.sh exec "$dir" "$1" -- "${@:2}"; }
now_us() { echo "${EPOCHREALTIME/./}"; }
die() { echo "rig-isolate: $*" >&2; exit 1; }
out="$dir/isolate.jsonl"

# The leader of the highest term any host knows (a deposed leader just healed still names itself).
leader_term() {
  local host
  for host in "${hosts[@]}"; do
    "$corral" --cluster "$dir" --server "10.77.0.$((10 + ${host#h})):7100" cluster --json 2>/dev/null || true
  done | python3 -c 'import json,sys; d=max((json.loads(l) for l in sys.stdin if l.strip()), key=lambda d: d["term"]); print(d["leader"], d["term"])'
}
# Submits from a host that is neither the target nor the spare (the shims, as a user would).
sbatch() { h "$via" /usr/local/libexec/corral/slurm/sbatch --parsable -c "$cpus" --mem 64M -o /dev/null "$@"; }
running() { h "$1" pgrep -xf "sleep $2" >/dev/null 2>&1; }
wait_running() {
  local deadline=$((SECONDS + 30))
  until running "$1" "$2"; do [ $SECONDS -lt $deadline ] || die "sleep $2 not running on $1 after 30 s"; sleep 0.1; done
}

scripts/hosts.sh wait-up "$dir"
for i in $(seq 1 "$n"); do
  read -r leader term < <(leader_term)
  others=($(printf '%s\n' "${hosts[@]}" | grep -vx "$leader"))
  if [ $((i % 2)) = 1 ]; then role=leader target="$leader" spare="${others[0]}"; else role=other target="${others[0]}" spare="${others[1]}"; fi
  via="$(printf '%s\n' "${hosts[@]}" | grep -vx -e "$target" -e "$spare" | head -1)"
  fillers=() spare_filler=""
  for host in "${hosts[@]}"; do
    [ "$host" = "$target" ] && continue
    secs=$((47000 + i * 10 + ${host#h}))
    id="$(sbatch -w "$host" --wrap "exec sleep $secs")"
    if [ "$host" = "$spare" ]; then spare_filler="$id"; else fillers+=("$id"); fi
    wait_running "$host" "$secs"
  done
  secs=$((46000 + i))
  job="$(sbatch --requeue --wrap "exec sleep $secs")"
  wait_running "$target" "$secs"
  "$corral" --cluster "$dir" cancel "$spare_filler" >/dev/null
  while running "$spare" "$((47000 + i * 10 + ${spare#h}))"; do sleep 0.05; done
  t0=$(now_us)
  case "$kind" in
    isolate) scripts/hosts.sh fault "$dir" isolate "$target" ;;
    oneway) for o in "${hosts[@]}"; do [ "$o" = "$target" ] || scripts/hosts.sh fault "$dir" oneway "$target" "$o"; done ;;
  esac
  gone="" elsewhere=""
  while [ -z "$gone" ] || [ -z "$elsewhere" ]; do
    t=$(( ($(now_us) - t0) / 1000 ))
    [ "$t" -lt 30000 ] || break
    [ -n "$gone" ] || running "$target" "$secs" || gone=$t
    [ -n "$elsewhere" ] || ! running "$spare" "$secs" || elsewhere=$t
    sleep 0.02
  done
  scripts/hosts.sh heal "$dir" >/dev/null
  scripts/hosts.sh wait-up "$dir"
  read -r new_leader new_term < <(leader_term)
  echo "$kind of $target ($role; leader $leader, term $term): own run gone after ${gone:-never} ms, running on $spare after ${elsewhere:-never} ms (leader now $new_leader, term $new_term)"
  printf '{"kind":"%s","role":"%s","target":"%s","gone_ms":%s,"elsewhere_ms":%s,"term_before":%s,"term_after":%s}\n' \
    "$kind" "$role" "$target" "${gone:-null}" "${elsewhere:-null}" "$term" "$new_term" >>"$out"
  for id in "$job" "${fillers[@]}"; do "$corral" --cluster "$dir" cancel "$id" >/dev/null; done
  for host in "${hosts[@]}"; do
    while h "$host" pgrep -f "^sleep 4[67]" >/dev/null 2>&1; do sleep 0.1; done
  done
  sleep 2
done
python3 - "$out" "$kind" <<'EOF'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == sys.argv[2]]
for role in ("leader", "other"):
    for key in ("gone_ms", "elsewhere_ms"):
        v = sorted(r[key] for r in rows if r["role"] == role and r[key] is not None)
        missing = sum(1 for r in rows if r["role"] == role and r[key] is None)
        if v:
            print(f"{sys.argv[2]} of the {role}'s host, {key}: {len(v)} samples, min {v[0]}, median {v[(len(v) - 1) // 2]}, max {v[-1]}" + (f", {missing} never" if missing else ""))
    twice = sum(1 for r in rows if r["role"] == role and None not in (r["gone_ms"], r["elsewhere_ms"]) and r["elsewhere_ms"] <= r["gone_ms"])
    print(f"{sys.argv[2]} of the {role}'s host: {twice} samples with the job running elsewhere before its own run was gone")
EOF
