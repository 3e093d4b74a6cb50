#!/usr/bin/env bash
# Installs the newest spidercache wheel from target/wheels/ (`make python`) into the Python test
# environment and runs the package's tests there. The environment is a venv over Debian's
# /usr/bin/python3 (tools/setup.sh makes it), because Debian's python3-torch is installed for that
# interpreter only; a pyenv python3 earlier on PATH could import the abi3 wheel but not torch.
#   scripts/test-python.sh [VENV]   (default target/py/venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(cd "${1:-target/py/venv}" && pwd)
wheel=$(ls -t target/wheels/spidercache-*-abi3-*.whl 2>/dev/null | head -n 1)
[[ -n $wheel ]] || { echo "test-python: no wheel in target/wheels; run make python" >&2; exit 1; }
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
# Run from the tests folder so that `import spidercache` is the installed wheel, never the
# sources; the training test must not skip for want of torch or Fashion-MNIST.
cd python/spidercache/tests
SPIDERCACHE_REQUIRE_TORCH=1 exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider .
