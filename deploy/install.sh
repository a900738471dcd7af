#!/usr/bin/env bash
# Installs Corral on this machine: corrald and corral, the Slurm command shims, the systemd
# unit, the `corral` system user and the directories corrald uses. Run as root from the
# repository after `cargo build --release` (or give --bin-dir). Idempotent.
#
#   deploy/install.sh [--bin-dir DIR] [--no-user] [--no-systemctl]
#
# Environment (all optional):
#   DESTDIR        stage everything under this root (packaging, tests); implies --no-systemctl
#   PREFIX         binaries in PREFIX/bin, shims in PREFIX/libexec/corral/slurm (/usr/local)
#   SYSCONFDIR     configuration in SYSCONFDIR/corral (/etc)
#   LOCALSTATEDIR  data in LOCALSTATEDIR/lib/corral, logs in LOCALSTATEDIR/log/corral (/var)
#   UNITDIR        where corrald.service goes (/etc/systemd/system)
#   CORRAL_USER    system group that may read corrald's config, data and logs (corral)
#
# --no-user       do not create the user or change owners (for tests and unprivileged staging)
# --no-systemctl  do not run `systemctl daemon-reload`
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

bin_dir=""
make_user=1
run_systemctl=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) bin_dir="${2:?--bin-dir needs a directory}"; shift 2 ;;
    --bin-dir=*) bin_dir="${1#--bin-dir=}"; shift ;;
    --no-user) make_user=0; shift ;;
    --no-systemctl) run_systemctl=0; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

DESTDIR="${DESTDIR:-}"
PREFIX="${PREFIX:-/usr/local}"
SYSCONFDIR="${SYSCONFDIR:-/etc}"
LOCALSTATEDIR="${LOCALSTATEDIR:-/var}"
UNITDIR="${UNITDIR:-/etc/systemd/system}"
CORRAL_USER="${CORRAL_USER:-corral}"
[ -n "$DESTDIR" ] && run_systemctl=0

for v in PREFIX SYSCONFDIR LOCALSTATEDIR UNITDIR; do
  case "${!v}" in
    /*) ;;
    *) echo "install.sh: $v must be an absolute path, not '${!v}'" >&2; exit 2 ;;
  esac
done

if [ -z "$bin_dir" ]; then
  bin_dir="${CARGO_TARGET_DIR:-$repo/target}/release"
fi
for b in corrald corral; do
  if [ ! -x "$bin_dir/$b" ]; then
    echo "install.sh: $bin_dir/$b not found: run 'cargo build --release --workspace --bins' or pass --bin-dir" >&2
    exit 1
  fi
done

bindir="$PREFIX/bin"
shimdir="$PREFIX/libexec/corral/slurm"
docdir="$PREFIX/share/doc/corral"
confdir="$SYSCONFDIR/corral"
datadir="$LOCALSTATEDIR/lib/corral"
logdir="$LOCALSTATEDIR/log/corral"

say() { echo "install.sh: $*"; }

# 1. The user corrald (and, until per-user execution lands, every job) runs as.
if [ "$make_user" = 1 ]; then
  if ! getent passwd "$CORRAL_USER" >/dev/null; then
    nologin="$(command -v nologin || echo /usr/sbin/nologin)"
    useradd --system --user-group --home-dir "$datadir" --no-create-home --shell "$nologin" \
      --comment "Corral node daemon" "$CORRAL_USER"
    say "created system user $CORRAL_USER"
  fi
  # NVIDIA device nodes are usually 0666; where they are not, they belong to video or render.
  for g in video render; do
    if getent group "$g" >/dev/null && ! id -nG "$CORRAL_USER" | tr ' ' '\n' | grep -qx "$g"; then
      usermod -a -G "$g" "$CORRAL_USER"
      say "added $CORRAL_USER to group $g"
    fi
  done
fi

# 2. Binaries and the Slurm shims (symlinks to corral, which then acts as sbatch, srun, ...).
install -d -m 0755 "$DESTDIR$bindir" "$DESTDIR$shimdir" "$DESTDIR$docdir" "$DESTDIR$docdir/examples"
install -m 0755 "$bin_dir/corrald" "$DESTDIR$bindir/corrald"
install -m 0755 "$bin_dir/corral" "$DESTDIR$bindir/corral"
"$DESTDIR$bindir/corral" install-slurm-shims "$DESTDIR$shimdir" >/dev/null
# The shims point at the staged binary; point them where it will be once installed.
for link in "$DESTDIR$shimdir"/*; do
  [ -L "$link" ] && ln -sfn "$bindir/corral" "$link"
done

# 3. Documentation and example configurations.
install -m 0644 "$here/README.md" "$DESTDIR$docdir/README.md"
install -m 0644 "$here"/examples/*.toml "$DESTDIR$docdir/examples/"

# 4. The systemd unit, with this installation's paths.
install -d -m 0755 "$DESTDIR$UNITDIR"
for unit in corrald.service corral-restd.service; do
  sed -e "s#/usr/local/bin/corrald#$bindir/corrald#g" \
      -e "s#/usr/local/bin/corral #$bindir/corral #g" \
      -e "s#/etc/corral/#$confdir/#g" \
      -e "s#/usr/local/share/doc/corral/#$docdir/#g" \
      "$here/systemd/$unit" > "$DESTDIR$UNITDIR/$unit.tmp"
  chmod 0644 "$DESTDIR$UNITDIR/$unit.tmp"
  mv "$DESTDIR$UNITDIR/$unit.tmp" "$DESTDIR$UNITDIR/$unit"
done

# 5. Directories: root's (corrald runs as root to start jobs as their users, without
# CAP_DAC_OVERRIDE, so it must own them), readable by the group for operators.
install -d -m 0750 "$DESTDIR$confdir" "$DESTDIR$datadir" "$DESTDIR$logdir"
if [ "$make_user" = 1 ]; then
  chown "root:$CORRAL_USER" "$DESTDIR$confdir" "$DESTDIR$datadir" "$DESTDIR$logdir"
fi

if [ "$run_systemctl" = 1 ] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
fi

say "installed corrald and corral in $DESTDIR$bindir, Slurm shims in $DESTDIR$shimdir, units $DESTDIR$UNITDIR/corrald.service and corral-restd.service"
say "next: $bindir/corral cluster init --dir $confdir --name NAME --listen ADDR:7100 --socket /run/corral/corral.sock --runtime-dir /run/corral/jobs   (first node)"
say "  or: $bindir/corral cluster join --dir $confdir --token TOKEN --bundle FILE --server ADDR:7100 --name NAME --listen ADDR:7100 --socket /run/corral/corral.sock --runtime-dir /run/corral/jobs"
say "then: systemctl enable --now corrald   (and corral-restd for the REST API; see $docdir/README.md)"
