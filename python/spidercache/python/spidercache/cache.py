"""The cache: one policy of the crate, the dataset's labels and its loader."""

from __future__ import annotations

import os
import weakref
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from . import _native

Loader = Callable[[int], Any]


class Answer(NamedTuple):
    """The policy's answer to one request."""

    kind: str
    """``"hit"``, ``"substitute"`` or ``"miss"``."""
    data: Optional[bytes]
    """The bytes served (``None`` on a miss)."""
    served: int
    """The id whose bytes are served (the requested id unless a substitute)."""
    label: int
    """The label to train with."""
    label_source: str
    """``"own"``, or for a substitute ``"requested"`` (SpiderCache's homophily:
    the served sample is a same-label near-duplicate) or ``"served"`` (iCache's
    and Quiver's arbitrary substitutes)."""


def as_array(values: Any, dtype: str) -> np.ndarray:
    """``values`` (numpy array, torch tensor or sequence) as a contiguous array."""
    if hasattr(values, "detach"):  # a torch tensor, possibly on a GPU or needing grad
        values = values.detach().cpu().numpy()
    return np.ascontiguousarray(values, dtype=dtype)


def _bytes_loader(loader: Loader) -> Callable[[int], bytes]:
    def load(sample_id: int) -> bytes:
        data = loader(int(sample_id))
        return data if isinstance(data, bytes) else bytes(data)

    return load


class Cache:
    """A cache policy over a dataset of ``len(labels)`` samples with ids ``0..n``.

    ``policy`` is one of :func:`policy_names` (``"spidercache"``, ``"shade"``,
    ``"icache"``, ``"quiver"``, ``"lru"``, ``"lfu"``, ``"static"``,
    ``"nocache"``); ``settings`` overrides its defaults (the authors'), one key
    per field of the crate's config, e.g. ``{"split": {"kind": "fixed",
    "importance": 0.5}, "scoring": "inline"}`` for SpiderCache. An unknown key
    is a ``ValueError`` naming the known ones.

    ``loader(id)`` reads one sample's encoded bytes from storage (bytes, or
    anything ``bytes()`` accepts). The dataset wrapper calls it on a miss, and
    some policies call it themselves from their own threads (SpiderCache's
    homophily representatives, iCache's stream, Quiver's packages), so it must
    be safe to call from another thread.

    The budget is ``capacity_items`` samples and ``capacity_bytes`` bytes
    (unbounded when ``None``); the policy never holds more of either.
    """

    def __init__(
        self,
        policy: str,
        labels: Any,
        loader: Loader,
        *,
        batch_size: int,
        capacity_items: int,
        capacity_bytes: Optional[int] = None,
        seed: int = 0,
        settings: Optional[dict] = None,
    ) -> None:
        labels = np.asarray(labels)
        if labels.ndim != 1 or labels.size == 0:
            raise ValueError("labels must be a non-empty 1-D array, one label per sample")
        if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or labels.max() >= 1 << 32:
            raise ValueError("labels must be integers in 0..2**32")
        self.labels = as_array(labels, "<u4")
        self.labels.setflags(write=False)
        self.loader = _bytes_loader(loader)
        bytes_budget = (1 << 64) - 1 if capacity_bytes is None else int(capacity_bytes)
        self._native = _native.Policy(
            policy,
            self.labels.tobytes(),
            int(batch_size),
            int(capacity_items),
            bytes_budget,
            self.loader,
            int(seed),
            dict(settings) if settings else None,
        )
        self._epoch = 0
        self._in_epoch = False
        self._pid = os.getpid()
        # Stops the policy's threads before the interpreter shuts down.
        weakref.finalize(self, self._native.close)

    @property
    def name(self) -> str:
        """The policy's short name."""
        return self._native.name

    @property
    def num_samples(self) -> int:
        """Samples in the dataset."""
        return self._native.num_samples

    @property
    def batch_size(self) -> int:
        """Samples per minibatch the policy orders."""
        return self._native.batch_size

    @property
    def epoch(self) -> int:
        """The current epoch (counted from 0; the next one between epochs)."""
        return self._epoch

    def capacity(self) -> tuple:
        """The budget, ``(items, bytes)``."""
        return self._native.capacity()

    def usage(self) -> tuple:
        """What the policy holds now, ``(items, bytes)``."""
        return self._native.usage()

    def check_process(self) -> None:
        """Fails in a forked process (a DataLoader worker), where the cache is a copy."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                "spidercache: the cache was used in a forked process (a DataLoader "
                "worker?); its state lives in the training process: use num_workers=0"
            )

    def begin_epoch(self) -> None:
        """Draws the current epoch's order (the samplers call this)."""
        self.check_process()
        if self._in_epoch:
            raise RuntimeError(
                f"epoch {self._epoch} is still open: call end_epoch() before the next one"
            )
        self._native.begin_epoch(self._epoch)
        self._in_epoch = True

    def next_batch(self) -> Optional[list]:
        """The ids of the next minibatch, or ``None`` at the end of the epoch."""
        return self._native.next_batch()

    def lookup(self, sample_id: int) -> Answer:
        """The policy's answer to a request for ``sample_id``."""
        return Answer(*self._native.lookup(int(sample_id)))

    def admit(self, sample_id: int, data: bytes) -> bool:
        """Offers a sample read after a miss; returns whether it was cached."""
        return self._native.admit(int(sample_id), data)

    def report(self, ids: Any, labels: Any, embeddings: Any = None, losses: Any = None) -> None:
        """The per-step hook: what the last optimizer step trained.

        One row per requested id, in request order: ``ids`` (n), the
        ``labels`` trained (n), the penultimate-layer ``embeddings`` (n x dim;
        ``None`` for policies that do not use them) and the per-sample
        ``losses`` (n, unreduced). Numpy arrays or torch tensors.
        """
        ids = as_array(ids, "<u8").reshape(-1)
        labels = as_array(labels, "<u4").reshape(-1)
        n = ids.size
        losses = as_array(np.zeros(n) if losses is None else losses, "<f4").reshape(-1)
        if embeddings is None:
            emb, dim = np.zeros((n, 0), "<f4"), 0
        else:
            emb = as_array(embeddings, "<f4")
            if emb.ndim != 2 or emb.shape[0] != n:
                raise ValueError(f"embeddings must be {n} x dim, got shape {emb.shape}")
            dim = emb.shape[1]
        self._native.report(ids.tobytes(), labels.tobytes(), emb.tobytes(), dim, losses.tobytes())

    def end_epoch(self, val_accuracy: Optional[float] = None) -> dict:
        """Closes the epoch; returns its counters (hits, substitutes, misses,
        ``storage_reads``, ``reads_per_request``, SpiderCache's score and
        homophily distributions). ``val_accuracy`` (0..1) drives the
        accuracy-gated samplers (SHADE's and SpiderCache's PADS)."""
        stats = self._native.end_epoch(val_accuracy)
        self._epoch += 1
        self._in_epoch = False
        return stats

    def sampler(self) -> "EpochSampler":
        """A sampler over each epoch's order, for ``DataLoader(sampler=...)``."""
        from .sampler import EpochSampler

        return EpochSampler(self)

    def batch_sampler(self) -> "BatchSampler":
        """The policy's minibatches, for ``DataLoader(batch_sampler=...)``."""
        from .sampler import BatchSampler

        return BatchSampler(self)

    def close(self) -> None:
        """Stops the policy's threads and frees the cache; later calls fail."""
        self._native.close()
