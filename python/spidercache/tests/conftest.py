"""Shared fixtures: an in-memory "remote" store that counts reads, and
embeddings made of tight same-label clusters (near-duplicates)."""

import threading

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
