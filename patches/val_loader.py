"""Patch ``DetectionValidator.get_dataloader``: ``model.val``'s images read on a pool of threads, stock's batches.

Stock validation reads its set through a ``DataLoader`` of worker processes (``workers``, at most one per batch),
each making whole batches: decode (``imread``), resize (``load_image``), ``LetterBox`` to the rectangular batch
shape, ``Format``, then the dataset's ``collate_fn``. The first batch waits for one worker to read its images one
after the other, and each worker is a fork of the validating process. The patched method builds stock's loader (the
dataset, its rectangular batch shapes and its sampler; no worker starts until a loader is iterated) and returns a
:class:`ValLoader` over the same dataset and batches: each ``dataset[i]`` on a pool of threads (:func:`val_threads`:
at most 8 unless ``YOLO_FASTDETECT_DECODE_THREADS`` is set; :func:`val_read_ahead` batches ahead), collated by the
dataset's own ``collate_fn`` on one more thread, the images stacked straight into pinned memory there, so that
``preprocess``'s copy to the GPU is asynchronous. The same code makes every sample, so the batches are stock's, field
for field. The threads start when the loader is made: the validator warms the model up before it asks for the first
batch.

It applies where stock would read with worker processes on a GPU (``workers`` > 0, which stock sets to 0 on a CPU)
for plain detection from a ``YOLODataset`` without augmentation or image cache, batched in order; otherwise, and with
``YOLO_FASTDETECT_SOURCES=0``, the validator keeps stock's loader.
"""

from __future__ import annotations

from torch.utils.data import BatchSampler, SequentialSampler
from ultralytics.data.dataset import YOLODataset
from ultralytics.models.yolo.detect import DetectionValidator

from yolo_fastdetect import config
from yolo_fastdetect.sources import (
    DECODER_NICE_VARIABLE,
    READ_AHEAD_VARIABLE,
    SOURCES_VARIABLE,
    THREADS_VARIABLE,
    decode_threads,
    read_ahead,
)
from yolo_fastdetect.sources.dataset_batches import DatasetBatches

from ._patching import Patch, Replacement, parameters, require

# Threads reading the set unless YOLO_FASTDETECT_DECODE_THREADS is set. The samples' own Python holds the GIL, so
# past a point more threads only contend: on the 16-core H100 host the loader alone gave the first batch of 32 in
# 36-46 ms with 8 threads against 90-114 ms with 15 (docs/design.md, Validation).
DEFAULT_VAL_THREADS = 8
# Batches read ahead of the validator unless YOLO_FASTDETECT_READ_AHEAD is set. The loop waits on the loader, and
# 2 ahead left it idle through the model's warm-up: yolo12n fp32 on the H200 host, ours 1.63-2.04 ms an image with
# 4 against 1.87-2.63 with 2 (docs/design.md, Validation). Stock's 8 workers hold up to 16 batches.
DEFAULT_VAL_READ_AHEAD = 4


def val_threads() -> int:
    """Threads reading ``model.val``'s set: ``YOLO_FASTDETECT_DECODE_THREADS`` where set, else the file sources'
    default (cores - 1) and at most :data:`DEFAULT_VAL_THREADS`.

    Examples:
        >>> 1 <= val_threads() <= DEFAULT_VAL_THREADS  # with the variable unset
        True
    """
    if config.is_set(THREADS_VARIABLE):
        return decode_threads()
    return min(decode_threads(), DEFAULT_VAL_THREADS)


def val_read_ahead() -> int:
    """Batches read ahead of ``model.val``'s loop: ``YOLO_FASTDETECT_READ_AHEAD`` where set, else
    :data:`DEFAULT_VAL_READ_AHEAD`.

    Examples:
        >>> val_read_ahead()  # with the variable unset
        4
    """
    if config.is_set(READ_AHEAD_VARIABLE):
        return read_ahead()
    return DEFAULT_VAL_READ_AHEAD


class ValLoader(DatasetBatches):
    """The batches of a stock validation ``DataLoader`` (:class:`~yolo_fastdetect.sources.dataset_batches.
    DatasetBatches` over its dataset, batches and ``collate_fn``) with what the validator reads of it besides:
    ``dataset``, ``batch_size``, ``sampler``.

    Examples:
        >>> loader = ValLoader(stock_loader, threads=8, read_ahead=4, pin_key="img")  # doctest: +SKIP
        >>> for batch in loader:  # doctest: +SKIP
        ...     images = batch["img"]
    """

    def __init__(self, stock, **options):
        super().__init__(stock.dataset, list(stock.batch_sampler.sampler), stock.collate_fn, **options)
        self.batch_size, self.sampler = stock.batch_size, stock.sampler


def fast_loader_applies(validator: DetectionValidator, loader) -> bool:
    """Whether ``loader`` (what stock's ``get_dataloader`` returned) can be read by a :class:`ValLoader`: a GPU
    validation outside training that stock would read with workers, plain detection, a ``YOLODataset`` without
    augmentation or image cache, batched in order by a ``BatchSampler`` that ``InfiniteDataLoader`` repeats."""
    dataset = getattr(loader, "dataset", None)
    batches = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
    device = getattr(validator, "device", None)
    return (config.get(SOURCES_VARIABLE) and not validator.training and validator.args.task == "detect"
            and (validator.args.workers or 0) > 0 and getattr(device, "type", None) == "cuda"
            and type(dataset) is YOLODataset and not dataset.augment and getattr(dataset, "cache", None) is None
            and isinstance(batches, BatchSampler) and isinstance(batches.sampler, SequentialSampler)
            and loader.collate_fn == dataset.collate_fn)


def get_dataloader(self: DetectionValidator, dataset_path: str, batch_size: int):
    """Stock's ``get_dataloader``, its batches read on threads (:class:`ValLoader`) where
    :func:`fast_loader_applies`."""
    loader = PATCH.original("get_dataloader")(self, dataset_path, batch_size)
    if not fast_loader_applies(self, loader):
        return loader
    nice = config.get(DECODER_NICE_VARIABLE)
    fast = ValLoader(loader, threads=val_threads(), read_ahead=val_read_ahead(), pin_key="img", lower_priority=nice)
    fast.start()  # the validator warms the model up between making its loader and reading it: read meanwhile
    return fast


def _plan() -> list[Replacement]:
    """``get_dataloader(dataset_path, batch_size)`` on ``DetectionValidator``, a ``YOLODataset`` with its own
    ``collate_fn``."""
    stock = getattr(DetectionValidator, "get_dataloader", None)
    require(callable(stock) and parameters(stock) == ["self", "dataset_path", "batch_size"],
            "DetectionValidator.get_dataloader is not (self, dataset_path, batch_size)")
    require(callable(getattr(YOLODataset, "collate_fn", None)), "YOLODataset has no collate_fn")
    return [Replacement(DetectionValidator, "get_dataloader", get_dataloader)]


PATCH = Patch(
    "val_loader",
    "DetectionValidator.get_dataloader(dataset_path, batch_size) returning a DataLoader of a YOLODataset",
    _plan,
)
apply, revert, is_applied = PATCH.apply, PATCH.revert, PATCH.is_applied
