"""The samplers: each epoch's order as the policy draws it."""

import numpy as np
import pytest

import spidercache as sc


def test_a_uniform_epoch_visits_every_sample_once_in_a_seeded_order(store, labels):
    def orders(seed):
        cache = sc.Cache("nocache", labels, store, batch_size=32, capacity_items=0, seed=seed)
        out = []
        for _ in range(2):
            out.append(list(cache.sampler()))
            cache.end_epoch()
        return out

    first, second = orders(7)
    assert sorted(first) == list(range(500)) == sorted(second)
    assert first != second  # a new order each epoch
    assert orders(7) == [first, second]  # the seed fixes them
    assert orders(8)[0] != first


def test_batches_have_the_policys_size(store, labels):
    cache = sc.Cache("lru", labels, store, batch_size=32, capacity_items=10)
    sizes = [len(b) for b in cache.batch_sampler()]
    assert sizes[:-1] == [32] * (len(sizes) - 1) and sum(sizes) == 500
    assert len(cache.batch_sampler()) == len(sizes) == 16


def test_importance_sampling_repeats_cached_samples(store, labels):
    # SHADE after one epoch: cached samples are drawn rep_factor times, hits first.
    cache = sc.Cache("shade", labels, store, batch_size=50, capacity_items=100)
    ds = sc.CachedDataset(cache)
    for batch in cache.batch_sampler():
        got = [ds.fetch(i) for i in batch]
        cache.report(batch, [g.label for g in got], None, np.arange(len(batch)) % 7)
    cache.end_epoch(0.5)
    order = list(cache.sampler())
    assert len(order) == 500
    assert len(set(order)) < 500  # drawn with replacement, cached ids replicated
    first = [ds.fetch(i).kind for i in order[:50]]
    assert first.count("hit") == 50  # hits are placed first


def test_an_epoch_must_end_before_the_next(store, labels):
    cache = sc.Cache("nocache", labels, store, batch_size=32, capacity_items=0)
    list(cache.sampler())
    with pytest.raises(RuntimeError, match="end_epoch"):
        list(cache.sampler())
    cache.end_epoch()
    assert cache.epoch == 1
    assert len(list(cache.sampler())) == 500
