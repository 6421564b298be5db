"""A map-style dataset's batches made on a pool of threads: what a ``DataLoader`` with worker processes gives, the
same samples collated by the same function in the same order, without the processes.

Ultralytics' validation loader is a ``DataLoader`` whose worker processes each make whole batches: the first batch
waits for one worker to read its images one after the other, no more workers run than there are batches, and each
worker is a fork of the validating process. Here every sample is ``dataset[index]`` on a pool of threads
(:class:`.OrderedPrefetch`; decoding and resizing with OpenCV release the GIL), read ahead in index order, and one
more thread collates them into batches with the dataset's own ``collate_fn``, so a batch is the one the
``DataLoader`` makes. Optionally its image tensor is made in pinned memory there, so that the consumer's copy to
the GPU is a fast, asynchronous one: the images are stacked straight into the pinned batch
(:func:`collate_stacking_into`), not stacked into pageable memory and copied again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..pinned import pinned_empty
from .prefetch import OrderedPrefetch


def collate_stacking_into(collate_fn: Callable[[list], dict], samples: list[dict], key: str,
                          allocate: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] = pinned_empty) -> dict:
    """``collate_fn(samples)``, its ``key`` tensor in memory from ``allocate(shape, dtype=dtype)``.

    Where ``collate_fn`` stacks ``key`` along a new first dimension (told by collating the samples with an empty
    tensor of the same dtype in its place: the result must be ``(len(samples), 0)`` of that dtype), the samples'
    tensors are stacked straight into the allocated batch: one copy of the images, where collating and then
    pinning made two, the first into freshly faulted pageable memory (docs/design.md, Validation). Otherwise
    ``collate_fn`` runs on the samples and its ``key`` tensor is copied over.

    Examples:
        >>> samples = [{"img": torch.full((3, 4, 6), value, dtype=torch.uint8)} for value in (0, 1)]
        >>> def stack(batch):
        ...     return {"img": torch.stack([sample["img"] for sample in batch])}
        >>> collate_stacking_into(stack, samples, "img", allocate=torch.empty)["img"].shape
        torch.Size([2, 3, 4, 6])
    """
    tensors = [sample[key] for sample in samples]
    first = tensors[0]
    placeholder = first.new_empty(0)
    # The samples' other tensors are cloned for the trial (small: labels): a collate_fn may change them in place
    # (Ultralytics' adds each sample's index to its batch_idx), and the fallback collates the samples themselves.
    made = collate_fn([{name: placeholder if name == key else value.clone() if isinstance(value, torch.Tensor)
                        else value for name, value in sample.items()} for sample in samples])
    stacked = made.get(key)
    if isinstance(stacked, torch.Tensor) and stacked.shape == (len(samples), 0) and stacked.dtype == first.dtype:
        made[key] = torch.stack(tensors, 0, out=allocate((len(samples), *first.shape), dtype=first.dtype))
        return made
    made = collate_fn(samples)
    made[key] = allocate(tuple(made[key].shape), dtype=made[key].dtype).copy_(made[key])
    return made


class DatasetBatches:
    """The batches ``collate_fn([dataset[i] for i in indices])`` for each index list of ``batches``, in order, made up
    to ``read_ahead`` batches ahead of the consumer: the samples on ``threads`` threads, the collation on one more.

    Args:
        dataset: A map-style dataset whose ``__getitem__`` may run on several threads at once.
        batches: The index lists of the batches (a ``BatchSampler``'s output).
        collate_fn: Makes a batch of a list of samples.
        threads (int): Threads making samples.
        read_ahead (int): Batches made ahead of the consumer.
        pin_key (str | None): The key of a dict batch whose tensor is made in pinned memory (the samples' tensors
            under that key stacked into it, :func:`collate_stacking_into`), or None.
        lower_priority (bool): The threads run below the consumer's priority (:class:`.OrderedPrefetch`).

    Examples:
        >>> batches = DatasetBatches(list(range(10)), [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]], list, threads=2,
        ...                          read_ahead=2)
        >>> list(batches)
        [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    """

    def __init__(self, dataset, batches: Sequence[Sequence[int]], collate_fn: Callable[[list], Any], threads: int,
                 read_ahead: int, pin_key: str | None = None, lower_priority: bool = False):
        self.dataset, self.batches, self.collate_fn = dataset, [list(batch) for batch in batches], collate_fn
        self.threads, self.read_ahead, self.pin_key, self.lower_priority = threads, read_ahead, pin_key, lower_priority
        self._started: tuple[OrderedPrefetch, OrderedPrefetch] | None = None  # made by start(), not iterated yet

    def __len__(self) -> int:
        return len(self.batches)

    def start(self) -> None:
        """Start making the batches now, before the consumer asks for the first: the next iteration hands out these.
        A loader started and never iterated stops its threads when it is garbage-collected."""
        if self._started is None:
            self._started = self._pipeline()

    def _pipeline(self) -> tuple[OrderedPrefetch, OrderedPrefetch]:
        """The samples' and the batches' prefetchers, running from now on."""
        largest = max((len(batch) for batch in self.batches), default=1)
        samples = OrderedPrefetch(self.dataset.__getitem__, (i for batch in self.batches for i in batch),
                                  self.threads, self.read_ahead * largest, self.lower_priority)

        collate_fn, pin_key = self.collate_fn, self.pin_key  # (not self: a started pipeline holds no cycle)

        def collate(batch: list[int]):  # on the one collating thread, so the samples are taken in order
            chosen = [next(samples) for _ in batch]
            return collate_fn(chosen) if pin_key is None else collate_stacking_into(collate_fn, chosen, pin_key)

        return samples, OrderedPrefetch(collate, self.batches, 1, self.read_ahead, self.lower_priority)

    def __iter__(self) -> Iterator:
        (samples, collated), self._started = self._started or self._pipeline(), None
        try:
            yield from collated
        finally:  # also where the consumer stops early or a sample raises: no thread outlives the iteration
            collated.close()
            samples.close()
