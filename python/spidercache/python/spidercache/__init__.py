"""SpiderCache and its peer training-data caches, for PyTorch training loops.

The policies are the ``spidercache`` Rust crate's (SpiderCache, SHADE, iCache,
Quiver, LRU, LFU, CoorDL's static fill, no cache), built by name with their
settings. A training loop uses three pieces:

- :class:`Cache`: the policy, the dataset's labels and a ``loader(id) -> bytes``
  that reads one sample from storage (for example an HTTP read from an ndpipe
  store). Its :meth:`Cache.report` is the per-step hook that feeds the policy
  the ids, labels, embeddings and losses of each optimizer step.
- :class:`EpochSampler` / :class:`BatchSampler`: each epoch's order, as the
  policy draws it (importance sampling for SHADE and SpiderCache).
- :class:`CachedDataset`: answers each index from the cache (an exact hit, a
  substitute trained under the label the policy names, or a read through the
  loader that is offered back to the cache).

Nothing here imports torch: the samplers and the dataset follow
``torch.utils.data``'s protocols, and :meth:`Cache.report` takes numpy arrays
or torch tensors.
"""

from ._native import CacheError, __version__, policy_names
from .cache import Answer, Cache
from .dataset import CachedDataset, Fetched
from .sampler import BatchSampler, EpochSampler

__all__ = [
    "Answer",
    "BatchSampler",
    "Cache",
    "CacheError",
    "CachedDataset",
    "EpochSampler",
    "Fetched",
    "__version__",
    "policy_names",
]
