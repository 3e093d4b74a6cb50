# The two commands of the README: `make demo` and `make test`. Everything else supports them.
SHELL := /bin/bash
CACHE := $(CURDIR)/.cache
export NDPIPE_MODEL_DIR := $(CACHE)/model
export NDPIPE_SAMPLES_DIR := $(CACHE)/model/samples
export ORT_DYLIB_PATH := $(CACHE)/model/lib/libonnxruntime.so.1.32.0

.PHONY: setup build demo test lint bench-ingest bench-infer

## Install system packages, fetch the model, sample photos and benchmark data (idempotent).
setup:
	tools/setup.sh

build: setup
	cargo build --release --locked

## Set up, start the embedded store, import sample photos and Fashion-MNIST, keep serving.
demo: build
	scripts/demo.sh

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

## Set up, lint, and run every test.
test: setup lint
	cargo test --workspace --locked

## Ingest throughput over HTTP vs the decode-limited rate, in one run.
bench-ingest: build
	target/release/ndpipe bench ingest --json $(CACHE)/bench-ingest.json

## Offline inference: model-only limit, re-labelling, NDPipe's Python loop, feed rates, int8, latency.
bench-infer: build
	target/release/ndpipe bench infer --json $(CACHE)/bench-infer.json
