#!/usr/bin/env bash
# The embedded default, end to end: start `ndpipe serve` on ./data with the EfficientNet-Lite0
# model, import the sample photos and a slice of Fashion-MNIST (each photo is labelled on the
# store as it arrives), search by label, re-label the whole store, fine-tune a new head from the
# stored features and deploy it, then keep serving until Ctrl-C.
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
echo "== starting ndpipe serve on $URL (data in $DATA, log in $LOG)"
"$BIN" serve --data "$DATA" --listen "$LISTEN" --model-dir "$ROOT/.cache/model" >"$LOG" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
trap 'echo "a demo step failed; the last lines of $LOG:" >&2; tail -n 20 "$LOG" >&2' ERR
for _ in $(seq 300); do curl -fsS "$URL/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -fsS "$URL/healthz" >/dev/null || { echo "the store did not start" >&2; tail -n 20 "$LOG" >&2; exit 1; }

echo "== importing the scikit-image sample photos"
"$BIN" import "$ROOT/.cache/model/samples"
echo "== importing 1400 Fashion-MNIST images with their class and split"
"$BIN" import --fashion-mnist --limit 1400
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
echo "== search: the sample cat"
"$BIN" photos search "tiger cat" --limit 3
"$BIN" photos search tabby --limit 3
echo "== search: espresso"
"$BIN" photos search espresso --limit 3
echo "== re-label the whole store on the storage node"
"$BIN" relabel
echo "== fine-tune a Fashion-MNIST head from the stored features (2 pipelined runs), deploy it, re-label"
"$BIN" finetune --runs 2 --epochs 10 --batch 128
"$BIN" versions
echo "== search with the fine-tuned model"
"$BIN" photos search Trouser --limit 3
if [[ ${DEMO_EXIT:-0} == 1 ]]; then exit 0; fi
echo "== serving on $URL (data in $DATA, log in $LOG); Ctrl-C to stop"
wait $SERVER
