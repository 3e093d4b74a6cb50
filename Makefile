# The two commands of the README: `make demo` and `make test`. Everything else supports them.
SHELL := /bin/bash
CACHE := $(CURDIR)/.cache
export NDPIPE_MODEL_DIR := $(CACHE)/model
export NDPIPE_SAMPLES_DIR := $(CACHE)/model/samples
export ORT_DYLIB_PATH := $(CACHE)/model/lib/libonnxruntime.so.1.32.0
# The Python package's environment: Debian's python3 with its CPU torch, maturin and pytest
# (tools/setup.sh); its own cargo workspace and target directory.
PY_VENV := $(CURDIR)/target/py/venv
PY_CRATE := python/spidercache/Cargo.toml

.PHONY: setup build build-bench demo python test test-deploy lint fuzz bench-ingest bench-infer bench-finetune bench-drift bench-cache bench-faults bench-partition bench-crash bench-s3 bench-replication experiment-scaling experiment-rsweep experiment-rollout experiment-balance experiment-bandwidth experiment-cost bench-scale bench-words bench-other

## Install system packages, fetch the model, sample photos and benchmark data (idempotent).
setup:
	tools/setup.sh

build: setup
	cargo build --release --locked -p ndpipe

## The product binary and the benchmark binary (bench/ndpipe-bench), which starts it.
build-bench: setup
	cargo build --release --locked -p ndpipe -p ndpipe-bench

## Set up, start the embedded store, import sample photos and Fashion-MNIST, keep serving.
demo: build
	scripts/demo.sh

## The `spidercache` Python package (PyO3, abi3) as a wheel in target/wheels/.
python: setup
	$(PY_VENV)/bin/maturin build --release --locked --manifest-path $(PY_CRATE) \
	  --interpreter $(PY_VENV)/bin/python --target-dir target/py/cargo --out target/wheels

## Format, lints (-D warnings), rustdoc (warnings denied) and the crate graph's rules.
lint:
	cargo fmt --all --check
	cargo fmt --manifest-path $(PY_CRATE) --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	PYO3_PYTHON=$(PY_VENV)/bin/python cargo clippy --manifest-path $(PY_CRATE) --locked --target-dir target/py/cargo -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
	scripts/check-deps.sh

## Set up, lint, and run every test: the workspace's, the Python package's on its wheel, then
## the deploy files' offline checks.
test: setup lint python
	cargo test --workspace --locked
	scripts/test-python.sh $(PY_VENV)
	scripts/test-deploy.sh $(PY_VENV)

## The Helm chart and systemd units, checked offline (rendered, validated, linted, config-checked).
test-deploy:
	scripts/test-deploy.sh $(PY_VENV)

## Every cargo-fuzz target of fuzz/ for FUZZ_EXECS executions each (needs `cargo install cargo-fuzz`).
FUZZ_EXECS ?= 1000000
fuzz: build-bench
	target/release/ndpipe-bench fuzz --execs $(FUZZ_EXECS) --json $(CACHE)/bench-fuzz.json

## Ingest throughput over HTTP vs the decode-limited rate, in one run.
bench-ingest: build-bench
	target/release/ndpipe-bench ingest --json $(CACHE)/bench-ingest.json

## Offline inference: model-only limit, re-labelling, NDPipe's Python loop, feed rates, int8, latency.
bench-infer: build-bench
	target/release/ndpipe-bench infer --json $(CACHE)/bench-infer.json

## Fine-tuning across PipeStores: near-data vs conventional, bandwidth caps, runs, nodes, load balancing.
bench-finetune: build-bench
	target/release/ndpipe-bench finetune --json $(CACHE)/bench-finetune.json

## Drift: classes arrive in stages; stale vs fine-tuned accuracy.
bench-drift: build-bench
	target/release/ndpipe-bench drift --json $(CACHE)/bench-drift.json

## Duplicates: precision and recall per level on real photos and their edited copies (3 seeds).
bench-duplicates: build-bench
	target/release/ndpipe-bench duplicates

## SpiderCache vs its peers on a real training run reading a PipeStore (about 15 minutes).
bench-cache: build-bench
	target/release/ndpipe-bench cache run --out $(CACHE)/bench-cache

## Fault injection: 100 rounds of kill -9, SIGSTOP and restarts during jobs on a real cluster.
bench-faults: build-bench
	target/release/ndpipe-bench faults --rounds 100 --json $(CACHE)/bench-faults.json

## Partitions: 100 rounds of network cuts (a node from the database, from its peers, one
## direction, the Tuner from half the nodes) in network namespaces, as root.
bench-partition: build-bench
	target/release/ndpipe-bench partition --rounds 100 --json $(CACHE)/bench-partition.json

## Crash loops: 100 kill -9 cycles during uploads, deletes and compactions, then 30 during
## re-labelling and 30 during fine-tunes that deploy; every acknowledged write and label checked.
bench-crash: build-bench
	target/release/ndpipe-bench crash --cycles 100 --json $(CACHE)/bench-crash.json
	target/release/ndpipe-bench crash --cycles 30 --mode relabel --max-kill-ms 2500 --json $(CACHE)/bench-crash-relabel.json
	target/release/ndpipe-bench crash --cycles 30 --mode finetune --max-kill-ms 2500 --json $(CACHE)/bench-crash-finetune.json
	target/release/ndpipe-bench crash --cycles 20 --mode replicated --max-kill-ms 3000 --json $(CACHE)/bench-crash-replicated.json

## S3 throughput: the same large JPEGs up and down through aws s3 cp, s5cmd, boto3 and /v1.
bench-s3: build-bench
	target/release/ndpipe-bench s3 --json $(CACHE)/bench-s3.json

## NDPipe's scaling on emulated PipeStores (models capped at a calibrated rate): 1-8 nodes and
## near-data vs conventional under Tuner-ingress caps; tables and plots in docs/experiments/.
experiment-scaling: build-bench
	target/release/ndpipe-bench scaling --json $(CACHE)/experiment-scaling.json

## A backbone rollout on 1, 2, 4 emulated PipeStores: aggregate photos/s against the sum of the
## nodes' model-only rates (target 0.9); table and plot in docs/experiments/.
experiment-rollout: build-bench
	target/release/ndpipe-bench rollout --json $(CACHE)/experiment-rollout.json

## Pipelined runs r = 1, 2, 4 on 4 emulated PipeStores, training-heavy: the time saved, measured
## as (extract-only + train-only) - total, and top-1 per r; table and plot in docs/experiments/.
experiment-rsweep: build-bench
	target/release/ndpipe-bench rsweep --photos-per-node 280 --headroom 0.25 --json $(CACHE)/experiment-rsweep.json

## Load balancing on 2 emulated PipeStores, one with a 4x slower model: LB off vs on vs the
## proportional ideal, 3 rounds; table and plot in docs/experiments/.
experiment-balance: build-bench
	target/release/ndpipe-bench balance --photos-per-node 210 --json $(CACHE)/experiment-balance.json

## Near-data vs conventional on 4 emulated PipeStores under five Tuner-ingress caps, from an
## eighth to twice the tensors' rate; table and plot in docs/experiments/bandwidth/.
experiment-bandwidth: build-bench
	target/release/ndpipe-bench scaling --nodes 4 --cap-nodes 4 --photos-per-node 70 \
	  --cap-fractions 0.125,0.25,0.5,1,2 --out docs/experiments/bandwidth \
	  --json $(CACHE)/experiment-bandwidth.json

## Feature extraction's dollars per million images, near-data vs conventional: the model-only rate
## and wire bytes measured in the run, prices stated (flags); table and plot in docs/experiments/.
experiment-cost: build-bench
	target/release/ndpipe-bench cost --json $(CACHE)/experiment-cost.json

## Replication: uploads and reads with 1, 2, 3 copies and the repair rate after a node's removal.
bench-replication: build-bench
	target/release/ndpipe-bench replication --json $(CACHE)/bench-replication.json

## One node filled to SCALE_PHOTOS photos: ingest rate, search and list p99, disk, RSS, fine-tune.
SCALE_PHOTOS ?= 1000000
bench-scale: build-bench
	target/release/ndpipe-bench scale --photos $(SCALE_PHOTOS) --json $(CACHE)/bench-scale.json

## Search in words: 77 written queries over ImageNet's and Fashion-MNIST's classes, against controls.
bench-words: build-bench
	target/release/ndpipe-bench words --json $(CACHE)/bench-words.json

## What a task's label rules keep and send to `other` (in-task, held-out classes, real photos).
bench-other: build-bench
	target/release/ndpipe-bench other --json $(CACHE)/bench-other.json
