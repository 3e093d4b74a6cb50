"""Policies by name, their settings, and what every policy promises."""

import numpy as np
import pytest

import spidercache as sc
from conftest import run_epoch


def test_names_are_the_crates_policies():
    assert sc.policy_names() == [
        "nocache", "lru", "lfu", "static", "shade", "icache", "quiver", "spidercache",
    ]


@pytest.mark.parametrize("name", sc.policy_names())
def test_every_policy_runs_epochs_within_its_budget(name, store, labels):
    rng = np.random.default_rng(1)
    embeddings = rng.normal(size=(500, 8)).astype(np.float32)
    settings = {"scoring": "inline"} if name == "spidercache" else None
    cache = sc.Cache(name, labels, store, batch_size=25, capacity_items=50,
                     capacity_bytes=50 * 16, seed=3, settings=settings)
    ds = sc.CachedDataset(cache)
    reads = 0
    for _ in range(3):
        stats, answers = run_epoch(cache, ds, embeddings)
        reads += stats["storage_reads"]
        assert stats["requests"] == len(answers) > 0
        assert stats["exact_hits"] + stats["substitutes"] + stats["misses"] == stats["requests"]
        items, used = cache.usage()
        assert items <= 50 and used <= 50 * 16
        for a in answers:  # every answer is bytes of the sample it names
            assert a.data == store.samples[a.served]
    # Every read went through the loader: the dataset's misses and the policy's own.
    assert store.reads == reads
    if name == "nocache":
        assert stats["exact_hits"] == 0 and cache.usage() == (0, 0)


def test_an_unknown_setting_names_the_known_ones(store, labels):
    with pytest.raises(ValueError, match=r"no setting 'warmup'.*warm_up"):
        sc.Cache("icache", labels, store, batch_size=10, capacity_items=5,
                 settings={"warmup": 1})


def test_unknown_policy_and_bad_values_are_refused(store, labels):
    with pytest.raises(ValueError, match="unknown policy 'arc'"):
        sc.Cache("arc", labels, store, batch_size=10, capacity_items=5)
    with pytest.raises(ValueError, match="rep_factor"):
        sc.Cache("shade", labels, store, batch_size=10, capacity_items=5,
                 settings={"rep_factor": 0.7})
    with pytest.raises(ValueError, match="radius"):
        sc.Cache("spidercache", labels, store, batch_size=10, capacity_items=5,
                 settings={"radius": {"kind": "quantile", "q": 2.0}})
    with pytest.raises(ValueError, match="setting 'beta'"):
        sc.Cache("icache", labels, store, batch_size=10, capacity_items=5,
                 settings={"beta": "high"})
    with pytest.raises(ValueError, match="labels"):
        sc.Cache("lru", [-1, 2], store, batch_size=10, capacity_items=5)


def test_nested_settings_reach_the_policy(store, labels):
    # A split that leaves nothing to the importance cache: every exact hit
    # would have to come from homophily representatives' own requests.
    cache = sc.Cache("spidercache", labels, store, batch_size=25, capacity_items=50,
                     settings={"preset": "artifact", "scoring": "inline", "k": 20,
                               "split": {"kind": "fixed", "importance": 0.0},
                               "radius": {"kind": "similarity", "threshold": 0.9}})
    ds = sc.CachedDataset(cache)
    stats, _ = run_epoch(cache, ds, np.zeros((500, 4), np.float32))
    assert stats["importance_share"] == 0.0


def test_a_closed_cache_refuses_calls(store, labels):
    cache = sc.Cache("lru", labels, store, batch_size=10, capacity_items=5)
    cache.close()
    with pytest.raises(RuntimeError, match="closed"):
        cache.lookup(0)
