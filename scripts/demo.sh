#!/usr/bin/env bash
# The embedded default, end to end: start `ndpipe serve` on ./data with the EfficientNet-Lite0
# model, import the sample photos and a slice of Fashion-MNIST into a task of its own (each photo
# is labelled on the store as it arrives, by every task), search by class and in words, find
# similar photos and duplicates, re-label the whole store, fine-tune the task's head from the
# stored features and deploy it (the general tags stay), then keep serving until Ctrl-C with
# the web console's URL and a key to sign in with.
# DEMO_EXIT=1 stops the server after the demo instead of serving on.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/target/release/ndpipe
DATA=${NDPIPE_DATA:-$ROOT/data}
LISTEN=${NDPIPE_LISTEN:-127.0.0.1:8080}
URL=http://$LISTEN
LOG=${NDPIPE_DEMO_LOG:-$ROOT/target/demo-server.log}
export NDPIPE_SERVER=$URL

# The server's log goes to a file, so that the demo's own output stays readable; its last lines
# are printed if a step fails.
# A console key left by a demo that was killed would close /v1 to the steps below.
if [[ -d $DATA ]]; then "$BIN" keys delete console-demo --data "$DATA" >/dev/null 2>&1 || true; fi
echo "== starting ndpipe serve on $URL (data in $DATA, log in $LOG)"
"$BIN" serve --data "$DATA" --listen "$LISTEN" --model-dir "$ROOT/.cache/model" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
trap 'echo "a demo step failed; the last lines of $LOG:" >&2; tail -n 20 "$LOG" >&2' ERR
for _ in $(seq 300); do curl -fsS "$URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "$URL/healthz" >/dev/null || { echo "the store did not start" >&2; tail -n 20 "$LOG" >&2; exit 1; }

echo "== importing the scikit-image sample photos"
"$BIN" import "$ROOT/.cache/model/samples"
echo "== a task of its own for Fashion-MNIST (the general ImageNet tags stay as they are)"
"$BIN" tasks show fashion >/dev/null 2>&1 || "$BIN" tasks create fashion
echo "== importing 1400 Fashion-MNIST images with their class and split, as the task's ground truth"
"$BIN" import --fashion-mnist --limit 1400 --task fashion
echo "== the store now holds"
curl -fsS "$URL/healthz"; echo
"$BIN" photos list --limit 5
echo "== waiting for online labelling to catch up (photos that overflow its queue wait for the re-labelling below)"
last=-1
for _ in $(seq 600); do
  done_count=$(curl -fsS "$URL/metrics" | awk '/^ndpipe_store_labelled_total/ {print $2}')
  done_count=${done_count%.*}
  [[ ${done_count:-0} -ge 1420 || ${done_count:-0} -eq $last ]] && break
  last=${done_count:-0}
  sleep 2
done
echo "== the sample cat uploaded again: the same bytes are answered with the stored photo (200, duplicate_of)"
CAT=$(curl -fsS --data-binary @"$ROOT/.cache/model/samples/chelsea.png" "$URL/v1/photos" |
  python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["id"]); print("duplicate_of", r.get("duplicate_of"), file=sys.stderr)')
echo "== search by class: the sample cat, espresso"
"$BIN" photos search "tiger cat" --limit 3
"$BIN" photos search espresso --limit 3
echo "== search in words (mapped onto the tasks' class names)"
"$BIN" photos search --words kitty --limit 3
"$BIN" photos search --words "coffee cup" --limit 3
echo "== photos similar to the cat (photo $CAT)"
"$BIN" photos similar "$CAT" --k 5
echo "== re-label the whole store on the storage node"
"$BIN" relabel
echo "== fine-tune the fashion task's head from the stored features (2 pipelined runs); it deploys when it validates no worse than the head it replaces"
"$BIN" finetune --task fashion --runs 2 --epochs 10 --batch 128
"$BIN" versions
"$BIN" tasks list
echo "== the cat keeps its general tags; in the fashion task it is \"other\" (no Fashion-MNIST class)"
"$BIN" photos labels "$CAT"
echo "== search in the fine-tuned task"
"$BIN" photos search Trouser --task fashion --limit 3
echo "== a resized copy of the cat, and the duplicate groups (exact, near)"
# Pillow (Debian's python3-pil, installed by the setup) makes the resized copy.
/usr/bin/python3 -c 'import sys; from PIL import Image; i = Image.open(sys.argv[1]); i.resize((i.width // 2, i.height // 2)).save(sys.argv[2])' \
  "$ROOT/.cache/model/samples/chelsea.png" "$ROOT/target/demo-cat-half.png"
curl -fsS --data-binary @"$ROOT/target/demo-cat-half.png" "$URL/v1/photos"; echo
for _ in $(seq 100); do
  [[ $(curl -fsS "$URL/v1/duplicates" | python3 -c 'import json, sys; print(json.load(sys.stdin)["unhashed"])') == 0 ]] && break
  sleep 0.2
done
"$BIN" photos duplicates --limit 5
if [[ ${DEMO_EXIT:-0} == 1 ]]; then exit 0; fi
# A key for the web console, made last (while no key exists, /v1 and the console are open) and
# deleted when the demo stops, so that the next run starts open again.
KEY=$(curl -fsS -H 'content-type: application/json' -d '{"name":"console-demo","role":"admin"}' "$URL/v1/admin/keys")
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true; "$BIN" keys delete console-demo --data "$DATA" >/dev/null 2>&1 || true' EXIT
echo "== serving on $URL (data in $DATA, log in $LOG); Ctrl-C to stop"
echo "== the web console: $URL/ui, sign in with this key (deleted when the demo stops):"
echo "$KEY" | python3 -c 'import json, sys; k = json.load(sys.stdin); print("   access key id:", k["access_key"]); print("   secret key:   ", k["secret_key"])'
wait $SERVER
