"""SpiderCache's homophily cache through the wrapper: near-duplicates are
served by a cached same-label representative, under the requested label."""

import numpy as np

import spidercache as sc
from conftest import Store, clustered, run_epoch


def test_substitutes_are_same_label_neighbours_under_the_requested_label():
    labels, embeddings = clustered(2000, per_cluster=10)
    store = Store(int(i).to_bytes(4, "little") * 8 for i in range(2000))
    cache = sc.Cache("spidercache", labels, store, batch_size=50, capacity_items=200,
                     settings={"scoring": "inline",
                               "split": {"kind": "fixed", "importance": 0.5}})
    ds = sc.CachedDataset(cache)
    epochs = [run_epoch(cache, ds, embeddings, val_accuracy=0.5 + 0.1 * e) for e in range(4)]
    subs = [a for _, answers in epochs for a in answers if a.kind == "substitute"]
    last, _ = epochs[-1]
    assert last["substitutes"] >= 0.1 * last["requests"]
    assert last["homophily"]["representatives"] > 0
    for a in subs:
        assert a.served != a.id
        assert a.label == labels[a.id] == labels[a.served]  # homophily is label-safe
        assert np.linalg.norm(embeddings[a.served] - embeddings[a.id]) < 1.0  # a near-duplicate
        assert a.data == store.samples[a.served]
    # The cache saves storage reads: fewer than half a read per request by the end.
    assert last["reads_per_request"] < 0.5
    assert last["neighbourhood"]["with_same"] > 0.9


def test_without_homophily_there_are_no_substitutes():
    labels, embeddings = clustered(1000, per_cluster=10)
    store = Store(bytes(8) for _ in range(1000))
    cache = sc.Cache("spidercache", labels, store, batch_size=50, capacity_items=100,
                     settings={"scoring": "inline"})  # the artifact's split: all importance
    ds = sc.CachedDataset(cache)
    for e in range(3):
        stats, _ = run_epoch(cache, ds, embeddings)
        assert stats["substitutes"] == 0
    assert stats["exact_hits"] > 0
