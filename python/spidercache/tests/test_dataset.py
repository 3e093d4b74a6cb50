"""The dataset wrapper: hits from the cache, misses through the loader."""

import os

import numpy as np
import pytest

import spidercache as sc


def test_a_miss_is_read_once_then_hit(store, labels):
    cache = sc.Cache("lru", labels, store, batch_size=10, capacity_items=100)
    ds = sc.CachedDataset(cache, decode=lambda b: int.from_bytes(b[:4], "little"))
    list(cache.sampler())  # open epoch 0
    first = ds.fetch(42)
    assert (first.kind, first.id, first.served, first.label) == ("read", 42, 42, 2)
    assert store.reads == 1
    again = ds.fetch(42)
    assert again.kind == "hit" and again.data == store.samples[42]
    assert store.reads == 1  # the hit read nothing
    assert ds[42] == (42, 2, 42)  # (decoded sample, label, requested id)
    assert len(ds) == 500


def test_a_cache_too_small_for_a_sample_keeps_reading(labels):
    big = [bytes(1000)] * 500
    cache = sc.Cache("lru", labels, lambda i: big[i], batch_size=10,
                     capacity_items=100, capacity_bytes=999)
    ds = sc.CachedDataset(cache)
    assert [ds.fetch(3).kind for _ in range(3)] == ["read"] * 3
    assert cache.usage() == (0, 0)


def test_the_loaders_error_reaches_the_caller(labels):
    def broken(i):
        raise ConnectionError(f"store down reading {i}")

    ds = sc.CachedDataset(sc.Cache("lru", labels, broken, batch_size=10, capacity_items=5))
    with pytest.raises(ConnectionError, match="reading 9"):
        ds[9]


def test_a_forked_worker_is_refused(store, labels, monkeypatch):
    ds = sc.CachedDataset(sc.Cache("lru", labels, store, batch_size=10, capacity_items=5))
    monkeypatch.setattr(os, "getpid", lambda: -1)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        ds[0]


def test_ids_outside_the_dataset_are_index_errors(store, labels):
    ds = sc.CachedDataset(sc.Cache("lru", labels, store, batch_size=10, capacity_items=5))
    with pytest.raises(IndexError):
        ds[500]
    with pytest.raises(IndexError):
        ds.cache.report([500], [0], None, [1.0])


def test_malformed_reports_are_value_errors(store, labels):
    cache = sc.Cache("spidercache", labels, store, batch_size=10, capacity_items=5,
                     settings={"scoring": "inline"})
    with pytest.raises(ValueError, match="embeddings"):
        cache.report([1, 2], [1, 2], np.zeros((3, 4)), [1.0, 1.0])
    with pytest.raises(ValueError, match="losses"):
        cache.report([1, 2], [1, 2], np.zeros((2, 4)), [1.0])
