#!/usr/bin/env bash
# Extract the real sample photos shipped in the scikit-image wheel into OUTDIR.
#   tools/model/fetch_samples.sh OUTDIR
# The wheel is fetched with `pip download --no-deps` (never installed) and checked
# against a pinned sha256. Idempotent: does nothing when OUTDIR/SHA256SUMS matches.
# Env: PYTHON (default python3), used only to run pip and unzip.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/common.sh"

[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
OUT=$1
PYTHON=${PYTHON:-python3}

SKIMAGE_SPEC=scikit-image==0.26.0
SKIMAGE_WHEEL=scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
SKIMAGE_SHA256=74aa5518ccea28121f57a95374581d3b979839adc25bb03f289b1bc9b99c58af
# Real photographs (colour or grey) in skimage/data/. Left out: the synthetic
# chessboard_*.png, color.png, logo.png, phantom.png, the horse.png silhouette,
# and the non-image files (.npy, .npz, .tif, .gif, .xml).
PHOTOS=(astronaut.png brick.png camera.png cell.png chelsea.png clock_motion.png coffee.png
  coins.png grass.png gravel.png hubble_deep_field.jpg ihc.png microaneurysms.png moon.png
  motorcycle_left.png motorcycle_right.png page.png retina.jpg rocket.jpg text.png)

if up_to_date "$OUT" && [[ $(wc -l <"$OUT/SHA256SUMS") -eq ${#PHOTOS[@]} ]]; then
  log "$OUT already holds the ${#PHOTOS[@]} sample photos"
  exit 0
fi

mkdir -p "$OUT"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Platform flags: the wheel is only read, so any local Python can fetch it.
fetch_wheel "$tmp" "$SKIMAGE_WHEEL" "$SKIMAGE_SHA256" "$SKIMAGE_SPEC" \
  --python-version 3.11 --implementation cp --abi cp311 --platform manylinux_2_28_x86_64

"$PYTHON" - "$tmp/$SKIMAGE_WHEEL" "$OUT" "${PHOTOS[@]}" <<'PY'
import os, sys, zipfile
wheel, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for n in names:
        data = z.read(f"skimage/data/{n}")
        with open(os.path.join(out, n + ".tmp"), "wb") as f:
            f.write(data)
        os.replace(os.path.join(out, n + ".tmp"), os.path.join(out, n))
PY
(cd "$OUT" && sha256sum "${PHOTOS[@]}" >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
log "extracted ${#PHOTOS[@]} photos from $SKIMAGE_WHEEL into $OUT"
