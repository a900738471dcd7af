#!/usr/bin/env bash
# Installs the real programs the client tests run (tests/tests/clients.rs): a Python venv outside
# the clone (CORRAL_PYENV, default /var/tmp/corral-pyenv, so a machine downloads torch once, like
# the target directory) with torch, PyTorch Lightning, submitit, dask-jobqueue and DeepSpeed, and
# the Prometheus text parser of prometheus-client (tests/tests/metrics.rs), and slurm-rest, the
# Python client generated from slurmrestd's OpenAPI description (tests/tests/rest.rs), and
# Selenium, which drives Debian's chromium through its chromedriver (tests/tests/web_ui.rs).
# From apt: chromium, chromium-driver and prometheus (tests/tests/prometheus.rs).
# Idempotent: does nothing when the venv already holds these versions.
set -euo pipefail
PYENV="${CORRAL_PYENV:-/var/tmp/corral-pyenv}"
PACKAGES=(torch==2.15.0 pytorch-lightning==2.6.6 submitit==1.5.4 dask-jobqueue==0.9.0 prometheus-client==0.26.0 slurm-rest==0.0.37.1 selenium==4.50.0)
# DeepSpeed is a source package whose build imports torch: built against the torch above, not
# in an isolated build environment (which would download torch a second time).
LATE_PACKAGES=(deepspeed==0.19.8)
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
apt_need=()
command -v chromium >/dev/null || apt_need+=(chromium)
command -v chromedriver >/dev/null || apt_need+=(chromium-driver)
command -v prometheus >/dev/null || apt_need+=(prometheus)
if [ ${#apt_need[@]} -gt 0 ]; then
  echo "setup-clients: installing ${apt_need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${apt_need[@]}"
  # Debian starts prometheus as a service on install; the tests start their own.
  if command -v systemctl >/dev/null && systemctl is-active -q prometheus 2>/dev/null; then
    $SUDO systemctl disable --now prometheus prometheus-node-exporter 2>/dev/null || true
  fi
fi
stamp="$PYENV/.corral-packages"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "${PACKAGES[*]} ${LATE_PACKAGES[*]}" ]; then
  exit 0
fi
command -v python3 >/dev/null || { echo "setup-clients: python3 not found" >&2; exit 1; }
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup-clients: installing python3-venv"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi
echo "setup-clients: installing ${PACKAGES[*]} into $PYENV (about 5.5 GB the first time)"
[ -x "$PYENV/bin/python" ] || python3 -m venv "$PYENV"
"$PYENV/bin/python" -m pip install -q --upgrade pip
"$PYENV/bin/python" -m pip install -q "${PACKAGES[@]}"
DS_BUILD_OPS=0 "$PYENV/bin/python" -m pip install -q --no-build-isolation "${LATE_PACKAGES[@]}"
"$PYENV/bin/python" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()'
echo "${PACKAGES[*]} ${LATE_PACKAGES[*]}" > "$stamp"
