"""A map-style dataset that answers each index from the cache."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

from .cache import Cache


class Fetched(NamedTuple):
    """One request as the dataset answered it."""

    data: bytes
    """The bytes trained on."""
    label: int
    """The label to train with (the requested sample's for SpiderCache's substitutes)."""
    id: int
    """The requested id: the one to report."""
    served: int
    """The id whose bytes these are."""
    kind: str
    """``"hit"``, ``"substitute"`` or ``"read"`` (a miss read through the loader)."""


class CachedDataset:
    """``dataset[i]`` is ``(decode(bytes), label, i)``, answered by ``cache``.

    An exact hit serves the cached bytes; a substitute serves another sample's
    bytes under the label the policy names (the requested sample's label for
    SpiderCache's same-label near-duplicates); a miss reads the sample with the
    cache's loader and offers it to the cache. The third field is the requested
    id, which is what :meth:`Cache.report` wants after the step.

    Use it with ``num_workers=0``: the cache's state lives in the training
    process, and a forked DataLoader worker would work on a copy (it fails
    instead).
    """

    def __init__(self, cache: Cache, decode: Optional[Callable[[bytes], Any]] = None) -> None:
        self.cache = cache
        self.decode = decode

    def __len__(self) -> int:
        return self.cache.num_samples

    def fetch(self, index: int) -> Fetched:
        """Answers ``index`` with the bytes, and says how."""
        self.cache.check_process()
        answer = self.cache.lookup(index)
        if answer.kind == "miss":
            data = self.cache.loader(index)
            self.cache.admit(index, data)
            return Fetched(data, answer.label, index, index, "read")
        return Fetched(answer.data, answer.label, index, answer.served, answer.kind)

    def __getitem__(self, index: int) -> tuple:
        got = self.fetch(int(index))
        sample = got.data if self.decode is None else self.decode(got.data)
        return sample, got.label, got.id
