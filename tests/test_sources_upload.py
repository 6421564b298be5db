"""Upload-ahead (:mod:`yolo_fastdetect.sources.upload`): the decoder threads' GPU copies are the images' bytes, handed
over once through their handles, by a batch only while it holds the very arrays that were uploaded, bounded in count
and bytes; and ``model.predict`` at batch 1 on folders, videos and lists letterboxes every image from them, with the
same results as stock."""

from __future__ import annotations

import numpy as np
import pytest
import torch

# corpus, model and the autouse fixture (the patch re-enabled) are test_sources' own
from test_sources import (  # noqa: F401
    assert_same_results,
    corpus,
    list_sources,
    model,
    restore_patch,
    stock_and_ours,
)
from yolo_fastdetect.sources import FileLoader, ImageBatch, PathListLoader, Uploads, file_loader, upload

cuda = pytest.mark.cuda


def random_images(generator: torch.Generator, count: int) -> list[np.ndarray]:
    """Uint8 BGR images of random, non-square sizes."""
    images = []
    for _ in range(count):
        height, width = (int(v) for v in torch.randint(17, 300, (2,), generator=generator))
        images.append(torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator).numpy())
    return images


@cuda
def test_taken_copies_are_the_images_bytes(generator):
    uploads = Uploads(torch.device("cuda", 0), capacity=16)
    images = random_images(generator, 6)
    handles = [uploads.put(image) for image in images]
    assert all(handle.image is image and handle.owner is uploads for handle, image in zip(handles, images))
    copies = uploads.take(handles[1:4])
    assert [tuple(c.shape) for c in copies] == [image.shape for image in images[1:4]]
    assert all(c.is_cuda and torch.equal(c.cpu(), torch.from_numpy(image)) for c, image in zip(copies, images[1:4]))
    assert all(handle.tensor is None for handle in handles[1:4])  # the caller holds the copies now, not the handles
    assert uploads.take(handles[1:2]) is None  # taken once
    assert uploads.take([handles[5], handles[0]]) is not None and len(uploads) == 1  # in any order; image 4 is left
    assert uploads.take([handles[4], handles[1]]) is None and len(uploads) == 1  # all or nothing


@cuda
def test_what_is_not_a_contiguous_bgr_image_stays_on_the_host(generator):
    uploads = Uploads(torch.device("cuda", 0), capacity=16)
    image = random_images(generator, 1)[0]
    others = [None, image[:, ::2], image[..., :1], image.astype(np.uint16), np.dstack([image, image[..., :1]])]
    for other in others:
        assert uploads.put(other) is None
    assert len(uploads) == 0


@cuda
def test_capacity_and_byte_budget_bound_the_uploads(generator, monkeypatch):
    uploads = Uploads(torch.device("cuda", 0), capacity=3)
    images = random_images(generator, 5)
    handles = [uploads.put(image) for image in images]
    assert len(uploads) == 3 and uploads.take(handles[:1]) is None  # the oldest were dropped
    assert handles[0].tensor is None and handles[1].tensor is None  # and their copies freed
    assert uploads.take(handles[2:]) is not None
    images[2] = np.ascontiguousarray(images[0][::-1])  # as large as image 0, other bytes
    monkeypatch.setattr(upload, "UPLOAD_BUDGET_BYTES", images[0].nbytes + images[1].nbytes)
    small = Uploads(torch.device("cuda", 0), capacity=8)
    first, second = small.put(images[0]), small.put(images[1])
    assert small.put(images[2]) is None and len(small) == 2  # over the budget: not uploaded
    assert small.take([first]) is not None  # taking returns its bytes to the budget
    third = small.put(images[2])
    assert small.take([second, third]) is not None
    cleared = small.put(images[0])
    small.clear()
    assert len(small) == 0 and cleared.tensor is None and small.take([cleared]) is None


@cuda
def test_a_batch_hands_over_its_uploads_only_while_it_holds_the_uploaded_images(generator):
    uploads = Uploads(torch.device("cuda", 0), capacity=16)
    images = random_images(generator, 3)
    handles = [uploads.put(image) for image in images]
    assert ImageBatch(images, handles).take_uploads(torch.device("cuda", 1)) is None  # another device
    replaced = ImageBatch(images, handles)
    replaced[1] = images[1].copy()  # equal bytes, another array (a callback's)
    assert replaced.take_uploads(torch.device("cuda", 0)) is None and len(uploads) == 3
    copies = ImageBatch(images, handles).take_uploads(torch.device("cuda", 0))
    assert all(torch.equal(c.cpu(), torch.from_numpy(image)) for c, image in zip(copies, images))
    assert ImageBatch(images, handles).take_uploads(torch.device("cuda", 0)) is None  # taken once


@pytest.fixture
def taken(monkeypatch) -> list:
    """What each batch's ``ImageBatch.take_uploads`` returned: None where the batch was not (all) uploaded."""
    calls = []
    original = ImageBatch.take_uploads

    def spy(self, device):
        result = original(self, device)
        calls.append(result)
        return result

    monkeypatch.setattr(ImageBatch, "take_uploads", spy)
    return calls


@cuda
@pytest.mark.parametrize("vid_stride", [1, 2])
def test_folder_with_videos_letterboxes_from_the_uploads(model, corpus, taken, vid_stride):
    stock, ours = stock_and_ours(model, str(corpus), batch=1, device="cuda", vid_stride=vid_stride)
    assert_same_results(stock["results"], ours["results"])
    assert ours["batches"] == stock["batches"] and ours["log"] == stock["log"]
    # imread gives every readable file here (gray, CMYK and PNG included) and every frame as 3-channel BGR, so
    # every batch must have been uploaded ahead.
    assert len(taken) == len(ours["batches"]) and all(copies is not None for copies in taken)


@cuda
@pytest.mark.parametrize("name", ["mixed sizes", "one size"])
def test_list_of_one_path_letterboxes_from_the_uploads(model, corpus, taken, name):
    """A list is one batch, as stock predicts it: a list of one path is batch 1, where the decoder uploads ahead."""
    stock, ours = stock_and_ours(model, list_sources(corpus)[name][:1], batch=1, device="cuda")
    assert_same_results(stock["results"], ours["results"])
    assert ours["log"] == stock["log"]
    assert len(taken) == len(ours["batches"]) and all(copies is not None for copies in taken)


@cuda
@pytest.mark.parametrize("setting", ["batch 2", "turned off"])
def test_no_upload_ahead_above_batch_1_or_when_turned_off(model, corpus, taken, monkeypatch, setting):
    batch = 2 if setting == "batch 2" else 1
    monkeypatch.setenv("YOLO_FASTDETECT_PYAV_VIDEO", "0")  # the folder's videos through cv2: no GPU frames either
    if setting == "turned off":
        monkeypatch.setenv("YOLO_FASTDETECT_UPLOAD_AHEAD", "0")
    assert file_loader(str(corpus), batch=batch, device=torch.device("cuda", 0)).uploads is None
    stock, ours = stock_and_ours(model, str(corpus), batch=batch, device="cuda")
    assert_same_results(stock["results"], ours["results"])
    assert len(taken) == len(ours["batches"]) and all(copies is None for copies in taken)


def test_the_loaders_upload_nothing_without_a_device(corpus):
    assert file_loader(str(corpus), batch=2).uploads is None
    paths = list_sources(corpus)["mixed sizes"]
    assert isinstance(file_loader(paths, batch=2), PathListLoader) and file_loader(paths).uploads is None
    assert isinstance(file_loader(str(corpus)), FileLoader)


def test_a_cpu_predictor_uploads_nothing(model, corpus):
    for _ in model.predict(str(corpus), stream=True, device="cpu", imgsz=256):
        images = model.predictor.batch[1]
        assert model.predictor.dataset.uploads is None
        assert isinstance(images, ImageBatch) and all(handle is None for handle in images.uploads)
