"""The loader: an HTTP read from a running store, called from the training
thread on a miss and from the policy's own threads for its reads."""

import os
import subprocess
import sys
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


DROP_MID_EPOCH = """
import gc, sys, threading, time
import numpy as np, spidercache as sc
from conftest import clustered, run_epoch

labels, embeddings = clustered(1000, per_cluster=10)
main = threading.get_ident()

def slow_off_main(i):  # the scoring worker's reads are slow: it is mid-read at the drop
    if threading.get_ident() != main:
        time.sleep(0.02)
    return bytes(8)

def partial_epoch(cache, ds):
    run_epoch(cache, ds, embeddings)
    for n, batch in enumerate(cache.batch_sampler()):
        got = [ds.fetch(i) for i in batch]
        cache.report(batch, [g.label for g in got], embeddings[[g.served for g in got]],
                     np.ones(len(batch)))
        if n == 4:
            return

settings = {"split": {"kind": "fixed", "importance": 0.5}, "max_lag": 4}
for _ in range(2):
    cache = sc.Cache("spidercache", labels, slow_off_main, batch_size=50,
                     capacity_items=100, settings=settings)
    partial_epoch(cache, sc.CachedDataset(cache))
    del cache
    gc.collect()
cache = sc.Cache("spidercache", labels, slow_off_main, batch_size=50, capacity_items=100,
                 settings=settings)
partial_epoch(cache, sc.CachedDataset(cache))  # and one left alive at exit
print("done")
"""


def test_dropping_a_cache_while_its_worker_reads_does_not_hang():
    # The worker waits for the GIL inside the loader while the cache is freed (the GIL
    # held) or the interpreter exits: both must let it finish instead of deadlocking.
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, "-c", DROP_MID_EPOCH], cwd=here, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr
