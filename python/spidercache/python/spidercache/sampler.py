"""Each epoch's order, as the policy draws it, in ``torch.utils.data``'s sampler protocols."""

from __future__ import annotations

from typing import Iterator, List

from .cache import Cache


class BatchSampler:
    """The policy's minibatches: ``DataLoader(dataset, batch_sampler=cache.batch_sampler())``.

    Iterating starts the cache's current epoch (so call :meth:`Cache.end_epoch`
    before iterating again) and asks the policy for one batch at a time, after
    the previous one was trained: iCache's selection and Quiver's probes depend
    on what was reported and cached up to then.
    """

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

    def __iter__(self) -> Iterator[List[int]]:
        self.cache.begin_epoch()
        while True:
            batch = self.cache.next_batch()
            if batch is None:
                return
            yield batch

    def __len__(self) -> int:
        """The nominal number of batches, ``ceil(num_samples / batch_size)``;
        policies that select (iCache) or over-probe (Quiver) may give fewer."""
        return -(-self.cache.num_samples // self.cache.batch_size)


class EpochSampler:
    """The epoch's ids one at a time: ``DataLoader(dataset, sampler=cache.sampler(),
    batch_size=cache.batch_size)``. Same order and epoch handling as
    :class:`BatchSampler`; the DataLoader cuts the batches, so give it the
    cache's batch size to keep the policy's batch boundaries."""

    def __init__(self, cache: Cache) -> None:
        self.batches = BatchSampler(cache)

    def __iter__(self) -> Iterator[int]:
        for batch in self.batches:
            yield from batch

    def __len__(self) -> int:
        """The nominal epoch length, ``num_samples`` (see :meth:`BatchSampler.__len__`)."""
        return self.batches.cache.num_samples
