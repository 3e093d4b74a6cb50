"""A small model trained on Fashion-MNIST with Debian's CPU PyTorch, through
the dataset wrapper and a real ``torch.utils.data.DataLoader``."""

import numpy as np
import pytest

import spidercache as sc
from conftest import fashion_mnist, need

torch = need("torch")


class Net(torch.nn.Module):
    """784 -> 128 -> 32 (the embedding the cache indexes) -> 10."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(784, 128), torch.nn.ReLU(),
            torch.nn.Linear(128, 32), torch.nn.ReLU())
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        embedding = self.body(x)
        return self.head(embedding), embedding


def decode(data):
    return torch.from_numpy(np.frombuffer(data, np.uint8).astype(np.float32) / 255.0)


def accuracy(model, images, labels):
    with torch.no_grad():
        logits, _ = model(torch.from_numpy(images.reshape(len(images), -1) / 255.0).float())
    return float((logits.argmax(1).numpy() == labels).mean())


def test_a_model_trains_through_the_cache_with_a_dataloader():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = 4000
    images = fashion_mnist("train-images-idx3-ubyte.gz", n)
    labels = fashion_mnist("train-labels-idx1-ubyte.gz", n).astype(np.int64)
    test_images = fashion_mnist("t10k-images-idx3-ubyte.gz", 1000)
    test_labels = fashion_mnist("t10k-labels-idx1-ubyte.gz", 1000)
    remote = [img.tobytes() for img in images]  # what a store would serve
    reads = []

    def loader(i):
        reads.append(i)
        return remote[i]

    cache = sc.Cache("spidercache", labels, loader, batch_size=64, capacity_items=n // 5,
                     seed=1, settings={"scoring": "inline",
                                       "split": {"kind": "fixed", "importance": 0.5}})
    dataset = sc.CachedDataset(cache, decode=decode)
    answers = []
    fetch = dataset.fetch
    dataset.fetch = lambda i: answers.append(fetch(i)) or answers[-1]
    loader_ = torch.utils.data.DataLoader(dataset, batch_sampler=cache.batch_sampler(),
                                          num_workers=0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    epoch_loss, stats, acc = [], [], 0.0
    for epoch in range(5):
        total, count = 0.0, 0
        for x, y, ids in loader_:
            logits, embedding = model(x)
            losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
            opt.zero_grad()
            losses.mean().backward()
            opt.step()
            cache.report(ids, y, embedding, losses)  # the per-step hook
            total, count = total + float(losses.sum()), count + len(ids)
        acc = accuracy(model, test_images, test_labels)
        epoch_loss.append(total / count)
        stats.append(cache.end_epoch(acc))

    # It learned: the loss fell and the held-out accuracy is a real classifier's.
    assert epoch_loss[-1] < 0.75 * epoch_loss[0], epoch_loss
    assert acc > 0.72, acc
    # The cache served: exact hits from epoch 1 on (most requests by the end, as the
    # importance sampler repeats cached samples), fewer storage reads than requests.
    assert all(s["exact_hits"] > 0 for s in stats[1:])
    assert stats[-1]["exact_hits"] > 0.3 * stats[-1]["requests"]
    requests = sum(s["requests"] for s in stats)
    assert len(reads) == sum(s["storage_reads"] for s in stats) < 0.9 * requests
    # Substitutes happened and carry the requested sample's label.
    subs = [a for a in answers if a.kind == "substitute"]
    assert subs and sum(s["substitutes"] for s in stats) == len(subs)
    for a in subs:
        assert a.served != a.id and a.label == labels[a.id] == labels[a.served]
        assert a.data == remote[a.served]
    for a in answers:
        if a.kind != "substitute":
            assert a.data == remote[a.id] and a.label == labels[a.id]


def test_the_epoch_sampler_feeds_a_dataloader_in_the_policys_order(store, labels):
    twin = sc.Cache("nocache", labels, store, batch_size=32, capacity_items=0, seed=5)
    expected = list(twin.sampler())
    cache = sc.Cache("nocache", labels, store, batch_size=32, capacity_items=0, seed=5)
    dataset = sc.CachedDataset(cache, decode=lambda b: torch.frombuffer(bytearray(b), dtype=torch.int32))
    loader = torch.utils.data.DataLoader(dataset, sampler=cache.sampler(),
                                         batch_size=cache.batch_size)
    batches = list(loader)
    ids = torch.cat([ids for _, _, ids in batches]).tolist()
    assert ids == expected and len(batches) == 16
    for x, y, i in batches:  # each row is the sample it names, with its label
        assert (x[:, 0] == i).all() and (y == torch.from_numpy(labels[i.numpy()])).all()


def test_a_forked_dataloader_worker_is_refused(store, labels):
    cache = sc.Cache("lru", labels, store, batch_size=32, capacity_items=10)
    loader = torch.utils.data.DataLoader(sc.CachedDataset(cache), sampler=cache.sampler(),
                                         batch_size=32, num_workers=1)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(iter(loader))
