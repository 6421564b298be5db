"""``model.val``'s loader on threads (``patches/val_loader.py``, ``sources/dataset_batches.py``): stock's batches,
field for field, on non-square images in rectangular batches; where it applies; errors and early stops."""

from __future__ import annotations

import copy
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from ultralytics.models.yolo.detect import DetectionValidator

from yolo_fastdetect.bench._val_dataset import write_images
from yolo_fastdetect.patches import val_loader
from yolo_fastdetect.sources import dataset_batches
from yolo_fastdetect.sources.dataset_batches import DatasetBatches

IMAGES, BATCH, IMGSZ = 13, 4, 320  # four rectangular batches, the last of one image


def write_set(root: Path, generator: torch.Generator) -> Path:
    """:data:`IMAGES` generated JPEGs with random labels (none on some images), and their data yaml."""
    seed = int(torch.randint(1 << 31, (1,), generator=generator))
    (root / "labels").mkdir(parents=True)
    for path in write_images(root / "images", IMAGES, seed):
        count = int(torch.randint(0, 4, (1,), generator=generator))
        centres = torch.rand(count, 2, generator=generator) * 0.6 + 0.2
        sizes = torch.rand(count, 2, generator=generator) * 0.3 + 0.05
        classes = torch.randint(0, 3, (count,), generator=generator)
        rows = [f"{c} {x:.5f} {y:.5f} {w:.5f} {h:.5f}\n" for c, (x, y), (w, h) in
                zip(classes.tolist(), centres.tolist(), sizes.tolist())]
        (root / "labels" / f"{path.stem}.txt").write_text("".join(rows))
    data = root / "data.yaml"
    data.write_text(f"path: {root}\ntrain: images\nval: images\nnames:\n  0: a\n  1: b\n  2: c\n")
    return data


def validator_for(data: Path, device: str, **args) -> DetectionValidator:
    """A validator set up as ``__call__`` sets it up before it asks for its loader (no model)."""
    from ultralytics.data.utils import check_det_dataset

    validator = DetectionValidator(args={"data": str(data), "imgsz": IMGSZ, "batch": BATCH, "rect": True,
                                         "workers": 2, "mode": "val", **args})
    validator.training, validator.device, validator.stride = False, torch.device(device), 32
    validator.data = check_det_dataset(str(data))
    validator.names = validator.data["names"]
    return validator


def stock_loader(validator: DetectionValidator):
    return val_loader.PATCH.original("get_dataloader")(validator, validator.data["val"], BATCH)


def assert_same(ours, stock, where: str = "batch") -> None:
    """Equal values of equal types, tensors of equal dtype, shape and layout, dict keys in the same order."""
    assert type(ours) is type(stock), where
    if isinstance(stock, torch.Tensor):
        assert ours.dtype == stock.dtype and ours.shape == stock.shape and ours.stride() == stock.stride(), where
        assert torch.equal(ours, stock), where
    elif isinstance(stock, np.ndarray):
        assert ours.dtype == stock.dtype and np.array_equal(ours, stock), where
    elif isinstance(stock, dict):
        assert list(ours) == list(stock), where
        for key in stock:
            assert_same(ours[key], stock[key], f"{where}[{key!r}]")
    elif isinstance(stock, (list, tuple)):
        assert len(ours) == len(stock), where
        for index, (mine, theirs) in enumerate(zip(ours, stock)):
            assert_same(mine, theirs, f"{where}[{index}]")
    else:
        assert ours == stock, where


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_batches_are_stocks(tmp_path, generator, device):
    """Stock's loader (two worker processes) against the threads, batch by batch; on a GPU the images are pinned."""
    validator = validator_for(write_set(tmp_path / "set", generator), device)
    stock = list(stock_loader(validator))
    ours = val_loader.ValLoader(stock_loader(validator), threads=3, read_ahead=2,
                                pin_key="img" if device == "cuda" else None)
    assert len(ours) == len(stock) == -(-IMAGES // BATCH)
    batches = list(ours)
    assert len({batch["img"].shape[2:] for batch in stock}) > 1, "rectangular batches of different shapes"
    assert [len(batch["im_file"]) for batch in stock] == [4, 4, 4, 1]
    for index, (mine, theirs) in enumerate(zip(batches, stock)):
        assert_same(mine, theirs, f"batch {index}")
        assert mine["img"].is_pinned() == (device == "cuda")


def test_stacking_into_the_batch_gives_the_collated_batch(tmp_path, generator):
    """The samples' images stacked straight into the allocated batch: ``collate_fn``'s batch field for field, the
    images in the allocated tensor; a ``collate_fn`` that does not stack them (another dtype, concatenated) is run
    on the samples and its tensor copied over."""
    dataset = stock_loader(validator_for(write_set(tmp_path / "set", generator), "cpu")).dataset
    allocated = []

    def allocate(shape, dtype):
        allocated.append(torch.full(shape, 7, dtype=dtype))
        return allocated[-1]

    def as_float(batch):
        made = dataset.collate_fn(batch)
        made["img"] = made["img"].float()
        return made

    def concatenated(batch):
        made = dataset.collate_fn(batch)
        made["img"] = torch.cat([sample["img"] for sample in batch])
        return made

    for first in range(0, IMAGES, BATCH):
        for collate_fn in (dataset.collate_fn, as_float, concatenated):
            samples = [dataset[i] for i in range(first, min(first + BATCH, IMAGES))]
            expected = collate_fn(copy.deepcopy(samples))  # (collate_fn changes the samples' batch_idx in place)
            made = dataset_batches.collate_stacking_into(collate_fn, samples, "img", allocate=allocate)
            assert_same(made, expected, f"{collate_fn.__name__} from image {first}")
            assert made["img"] is allocated[-1]


def test_the_patch_reads_where_stock_would_use_workers_on_a_gpu(tmp_path, generator, monkeypatch):
    """A ValLoader for detection on a GPU with workers; stock's loader for the CPU, ``workers=0``, other tasks, an
    image cache, augmentation, training and ``YOLO_FASTDETECT_SOURCES=0``. (Made, not read: no GPU needed.)"""
    data = write_set(tmp_path / "set", generator)
    gpu = validator_for(data, "cuda")
    loader = val_loader.get_dataloader(gpu, gpu.data["val"], BATCH)
    assert isinstance(loader, val_loader.ValLoader)
    assert loader.batch_size == BATCH and len(loader) == 4 and len(loader.dataset) == IMAGES
    assert list(loader.sampler) == list(range(IMAGES))  # what a custom-JSON validation reads
    assert val_loader.fast_loader_applies(gpu, stock_loader(gpu))

    assert not val_loader.fast_loader_applies(validator_for(data, "cpu"), stock_loader(validator_for(data, "cpu")))
    for args in ({"workers": 0}, {"cache": "ram"}):
        validator = validator_for(data, "cuda", **args)
        assert not val_loader.fast_loader_applies(validator, stock_loader(validator)), args
    segment = validator_for(data, "cuda")
    segment.args.task = "segment"
    assert not val_loader.fast_loader_applies(segment, stock_loader(gpu))
    gpu.training = True
    assert not val_loader.fast_loader_applies(gpu, stock_loader(validator_for(data, "cuda")))
    gpu.training = False
    augmented = stock_loader(gpu)
    augmented.dataset.augment = True
    assert not val_loader.fast_loader_applies(gpu, augmented)
    monkeypatch.setenv("YOLO_FASTDETECT_SOURCES", "0")
    assert not isinstance(val_loader.get_dataloader(gpu, gpu.data["val"], BATCH), val_loader.ValLoader)


def loader_with_variable(tmp_path, generator, monkeypatch, name: str, value: str | None):
    """The patched loader of a GPU validator, made with the variable ``name`` at ``value`` (None: unset)."""
    monkeypatch.delenv(name, raising=False)
    if value is not None:
        monkeypatch.setenv(name, value)
    gpu = validator_for(write_set(tmp_path / "set", generator), "cuda")
    return val_loader.get_dataloader(gpu, gpu.data["val"], BATCH)


@pytest.mark.parametrize(("cores", "variable", "expected"), [
    (16, None, 8), (4, None, 3), (1, None, 1), (16, "12", 12), (4, "6", 6),
])
def test_val_threads_default_to_at_most_eight_unless_set(tmp_path, generator, monkeypatch, cores, variable, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    loader = loader_with_variable(tmp_path, generator, monkeypatch, "YOLO_FASTDETECT_DECODE_THREADS", variable)
    assert val_loader.val_threads() == expected
    assert loader.threads == expected


@pytest.mark.parametrize(("variable", "expected"), [(None, 4), ("1", 1), ("6", 6)])
def test_val_read_ahead_is_four_unless_set(tmp_path, generator, monkeypatch, variable, expected):
    loader = loader_with_variable(tmp_path, generator, monkeypatch, "YOLO_FASTDETECT_READ_AHEAD", variable)
    assert val_loader.val_read_ahead() == expected
    assert loader.read_ahead == expected


def decoder_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("yolo_fastdetect_decode")]


def test_a_sample_error_reaches_the_consumer_and_stops_the_threads():
    class Failing:
        def __getitem__(self, index: int) -> int:
            if index == 6:
                raise FileNotFoundError(f"Image Not Found {index}")
            return index

    batches = DatasetBatches(Failing(), [[0, 1, 2], [3, 4, 5], [6, 7, 8]], list, threads=2, read_ahead=1)
    iterator = iter(batches)
    assert next(iterator) == [0, 1, 2] and next(iterator) == [3, 4, 5]
    with pytest.raises(FileNotFoundError, match="Image Not Found 6"):
        next(iterator)
    assert not decoder_threads()


def test_an_early_stop_stops_the_threads():
    batches = DatasetBatches(list(range(100)), [list(range(i, i + 5)) for i in range(0, 100, 5)], list, threads=3,
                             read_ahead=2)
    for batch in batches:
        assert batch == [0, 1, 2, 3, 4]
        break
    assert not decoder_threads()


class Recording:
    """A dataset whose samples are their indices, recording which were made (on any thread)."""

    def __init__(self, size: int):
        self.size, self.made = size, set()

    def __getitem__(self, index: int) -> int:
        self.made.add(index)
        return index


def wait_until(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_started_loader_reads_ahead_before_it_is_iterated():
    """``start()`` (what the patch calls, so that the set is read while the validator warms the model up) makes the
    first batches before the consumer asks; the iteration then hands out every batch once, in order, and a second
    iteration reads the set again."""
    dataset, batches = Recording(30), [list(range(i, min(i + 4, 30))) for i in range(0, 30, 4)]
    loader = DatasetBatches(dataset, batches, list, threads=3, read_ahead=2)
    loader.start()
    assert wait_until(lambda: set(range(8)) <= dataset.made), "the first two batches made before the iteration"
    assert list(loader) == batches
    dataset.made.clear()
    assert list(loader) == batches and dataset.made == set(range(30))
    assert not decoder_threads()


def test_a_started_loader_never_iterated_stops_its_threads_when_dropped():
    loader = DatasetBatches(Recording(50), [list(range(i, i + 5)) for i in range(0, 50, 5)], list, threads=3,
                            read_ahead=2)
    loader.start()
    assert decoder_threads()
    del loader
    assert wait_until(lambda: not decoder_threads())


def test_the_patch_starts_reading_when_it_makes_the_loader(tmp_path, generator, device="cuda"):
    """The validator's warm-up runs between ``get_dataloader`` and the loop: the patched loader reads meanwhile."""
    gpu = validator_for(write_set(tmp_path / "set", generator), device)
    loader = val_loader.get_dataloader(gpu, gpu.data["val"], BATCH)
    assert isinstance(loader, val_loader.ValLoader) and decoder_threads()
