"""The loader: an HTTP read from a running store, called from the training
thread on a miss and from the policy's own threads for its reads."""

import threading
import urllib.request

import pytest

import spidercache as sc
from conftest import SampleServer, clustered, run_epoch


@pytest.fixture
def server():
    s = SampleServer([int(i).to_bytes(4, "little") * 8 for i in range(1000)])
    yield s
    s.close()


def http_loader(url, callers):
    def load(sample_id):
        callers.add(threading.get_ident())
        with urllib.request.urlopen(f"{url}/samples/{sample_id}", timeout=10) as r:
            return r.read()

    return load


def test_background_reads_go_through_the_http_loader(server):
    labels, embeddings = clustered(1000, per_cluster=10)
    callers = set()
    cache = sc.Cache("spidercache", labels, http_loader(server.url, callers),
                     batch_size=50, capacity_items=100,
                     settings={"split": {"kind": "fixed", "importance": 0.5}})  # background scoring
    ds = sc.CachedDataset(cache)
    reads = fetches = 0
    for _ in range(3):
        stats, answers = run_epoch(cache, ds, embeddings)
        reads += stats["storage_reads"]
        fetches += stats["background_fetches"]
        assert all(a.data == server.samples[a.served] for a in answers)
    cache.close()  # joins the scoring worker: every read it made is counted
    assert fetches > 0 and server.requests == reads
    assert len(callers - {threading.get_ident()}) >= 1  # the scoring worker called it


def test_a_failing_loader_in_the_policys_own_read_is_a_cache_error(server):
    labels, embeddings = clustered(1000, per_cluster=10)
    main = threading.get_ident()
    inner = http_loader(server.url, set())

    def only_from_training_thread(sample_id):
        if threading.get_ident() != main:
            raise ConnectionError("store unreachable from the worker")
        return inner(sample_id)

    cache = sc.Cache("spidercache", labels, only_from_training_thread, batch_size=50,
                     capacity_items=100,
                     settings={"split": {"kind": "fixed", "importance": 0.5}})
    ds = sc.CachedDataset(cache)
    with pytest.raises(sc.CacheError, match="store unreachable from the worker"):
        for _ in range(3):
            run_epoch(cache, ds, embeddings)
