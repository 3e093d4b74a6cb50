#!/usr/bin/env bash
# The deploy files' offline checks, run by `make test`: the Helm chart (rendered with every value
# set in deploy/helm/ndpipe/ci, validated against the Kubernetes schemas, linted, its ndpipe.toml
# checked by `ndpipe config check`; scripts/check_chart.py), and the systemd units of
# deploy/systemd (checked by `systemd-analyze verify` when it is installed) with the
# configuration `ndpipe cluster init` makes. Nothing here needs the network: where it can, it
# runs in a network namespace of its own to prove it.
#   scripts/test-deploy.sh [VENV]   (default target/py/venv; NDPIPE_BIN: the binary to check with)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(cd "${1:-target/py/venv}" && pwd)
if [[ -z ${NDPIPE_BIN:-} ]]; then
  cargo build --locked -q -p ndpipe
  NDPIPE_BIN=$PWD/target/debug/ndpipe
fi
offline=()
if unshare -n true 2>/dev/null; then offline=(unshare -n); else echo "test-deploy: no network namespace here; running with the network"; fi

"${offline[@]}" "$VENV/bin/python" scripts/check_chart.py "$NDPIPE_BIN"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "test-deploy: $*" >&2; exit 1; }

# Plain hosts: the configuration `ndpipe cluster init` makes names files that exist ...
"$NDPIPE_BIN" cluster init "$tmp/etc" >/dev/null
for role in tuner gateway; do
  "$NDPIPE_BIN" config check --files --role "$role" "$tmp/etc/ndpipe.toml" >/dev/null \
    || fail "ndpipe config check --files --role $role failed on the cluster init configuration"
done
# ... and the check fails, naming the key, once one is gone.
rm "$tmp/etc/cluster-secret"
if out=$("$NDPIPE_BIN" config check --files --role tuner "$tmp/etc/ndpipe.toml" 2>&1); then
  fail "ndpipe config check --files passed with the cluster secret missing"
fi
[[ $out == *tuner.cluster_secret_file* ]] || fail "the missing file's key is not named: $out"
echo "  ndpipe config check --files: passes on cluster init's files, names tuner.cluster_secret_file once it is gone"

if ! command -v systemd-analyze >/dev/null; then
  echo "  systemd units: skipped (no systemd-analyze here)"
  exit 0
fi
# The units as installed, with the binary and configuration of this checkout in their places.
mkdir -p "$tmp/units"
for unit in deploy/systemd/*.service; do
  sed -e "s|/usr/local/bin/ndpipe|$NDPIPE_BIN|g" -e "s|/etc/ndpipe/|$tmp/etc/|g" "$unit" >"$tmp/units/${unit##*/}"
done
verify() { systemd-analyze verify --man=no "$@" 2>&1; }
out=$(verify "$tmp"/units/*.service) || fail "systemd-analyze verify failed: $out"
[[ -z $out ]] || fail "systemd-analyze verify warned: $out"
# The check must be able to fail: a misspelt key is reported.
sed -i 's/^RestartSec=/RestartSek=/' "$tmp/units/ndpipe-tuner.service"
out=$(verify "$tmp/units/ndpipe-tuner.service" || true)
[[ $out == *RestartSek* ]] || fail "systemd-analyze verify did not report a misspelt key: $out"
echo "  systemd units: $(ls deploy/systemd/*.service | wc -l) verified by systemd-analyze; a misspelt key is reported"
echo "test-deploy: ok"
