#!/usr/bin/env bash
# Extract the large 4K JPEG wallpapers of Debian's ukui-wallpapers package into OUTDIR, for the
# ingest benchmark. The .deb is fetched with `apt-get download` (no install, no dependencies).
#   tools/data/fetch_wallpapers.sh OUTDIR
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
OUT=$1
PKG=ukui-wallpapers
if compgen -G "$OUT/*.jpg" >/dev/null; then
  echo "[wallpapers] $OUT already holds $(ls "$OUT"/*.jpg | wc -l) JPEGs"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "$PKG" >/dev/null 2>&1) || {
  apt-get update >/dev/null 2>&1 || true
  (cd "$work" && apt-get download "$PKG" >/dev/null)
}
dpkg-deb -x "$work"/${PKG}_*.deb "$work/x"
mkdir -p "$OUT"
cp "$work"/x/usr/share/backgrounds/*.jpg "$OUT"/
echo "[wallpapers] extracted $(ls "$OUT"/*.jpg | wc -l) JPEGs into $OUT"
