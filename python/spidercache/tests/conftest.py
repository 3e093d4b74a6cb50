"""Shared fixtures: an in-memory "remote" store that counts reads,
embeddings made of tight same-label clusters (near-duplicates), and
Fashion-MNIST for the tests that train.

The training tests skip when torch, Pillow or the data set is missing, unless
``SPIDERCACHE_REQUIRE_TORCH=1`` (as ``make test`` sets): then they fail.
"""

import gzip
import importlib
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest


class Store:
    """Samples by id, standing in for remote storage; counts every read."""

    def __init__(self, samples):
        self.samples = list(samples)
        self.reads = 0
        self.readers = set()
        self._lock = threading.Lock()

    def __call__(self, sample_id):
        with self._lock:
            self.reads += 1
            self.readers.add(threading.get_ident())
        return self.samples[sample_id]


class SampleServer:
    """``GET .../{id}`` on 127.0.0.1 answers ``samples[id]``: a stand-in for an ndpipe store."""

    def __init__(self, samples):
        self.samples = samples
        self.requests = 0
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                with lock:
                    server.requests += 1
                body = server.samples[int(self.path.rsplit("/", 1)[1])]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def store():
    """500 samples of 16 bytes, each encoding its id."""
    return Store(int(i).to_bytes(4, "little") * 4 for i in range(500))


@pytest.fixture
def labels():
    return np.arange(500) % 5


def clustered(n, per_cluster, dim=16, classes=10, seed=0):
    """Labels and embeddings of ``n / per_cluster`` tight clusters, one label each."""
    rng = np.random.default_rng(seed)
    cluster = np.arange(n) // per_cluster
    centres = rng.normal(size=(cluster.max() + 1, dim)) * 10
    labels = cluster % classes
    embeddings = centres[cluster] + rng.normal(size=(n, dim)) * 0.05
    return labels, embeddings.astype(np.float32)


def run_epoch(cache, dataset, embeddings=None, val_accuracy=0.5):
    """One epoch through ``dataset``; reports the served samples' embeddings
    (what was trained). Returns the epoch's stats and every answer."""
    answers = []
    for batch in cache.batch_sampler():
        got = [dataset.fetch(i) for i in batch]
        answers.extend(got)
        served = [g.served for g in got]
        cache.report(
            batch,
            [g.label for g in got],
            None if embeddings is None else embeddings[served],
            np.ones(len(batch)),
        )
    return cache.end_epoch(val_accuracy), answers


REQUIRED = os.environ.get("SPIDERCACHE_REQUIRE_TORCH") == "1"
FASHION = Path(os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))


def need(module):
    """``module`` imported; a skip without it, a failure when required."""
    return importlib.import_module(module) if REQUIRED else pytest.importorskip(module)


def fashion_mnist(name, count):
    """The first ``count`` rows of a Fashion-MNIST idx file (Debian's dataset-fashion-mnist)."""
    path = FASHION / name
    if not path.exists():
        if REQUIRED:
            raise FileNotFoundError(path)
        pytest.skip(f"{path} missing (Debian package dataset-fashion-mnist)")
    with gzip.open(path) as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)[:count]
