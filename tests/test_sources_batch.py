"""The loaders' batch of original images (:class:`yolo_fastdetect.sources.ImageBatch`): a plain list to stock code,
which hands the predictor its images' uploads only while it holds the very arrays uploaded, and says when stock
letterboxes it as part of a batch of mixed shapes. The GPU side of the uploads is in test_sources_upload."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from sources_corpus import write_images
from yolo_fastdetect.sources import FileLoader, ImageBatch, PathListLoader
from yolo_fastdetect.sources.upload import Upload


def random_images(generator: torch.Generator, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    return [torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=generator).numpy() for h, w in shapes]


class RecordingOwner:
    """Stands in for an :class:`Uploads` on the CPU: records what is taken and hands back the handles' tensors."""

    def __init__(self, device: str = "cuda:0"):
        self.device, self.taken = torch.device(device), []

    def take(self, uploads):
        self.taken.append(list(uploads))
        return [upload.tensor for upload in uploads]


def handles(images: list[np.ndarray], owner) -> list[Upload]:
    return [Upload(image, torch.from_numpy(image), None, owner) for image in images]


def test_a_batch_is_the_list_of_its_images_to_stock_code(generator):
    images = random_images(generator, [(48, 80), (48, 80), (96, 40)])
    batch = ImageBatch(images, handles(images, RecordingOwner()))
    assert isinstance(batch, list) and batch == images and len(batch) == 3
    assert all(mine is theirs for mine, theirs in zip(batch, images))
    for other in (copy.copy(batch), copy.deepcopy(batch), pickle.loads(pickle.dumps(batch)), batch[:]):
        assert type(other) is list and len(other) == 3
        assert all(np.array_equal(mine, theirs) for mine, theirs in zip(other, images))


def test_take_uploads_only_for_the_uploaded_images_of_every_slot(generator):
    images = random_images(generator, [(48, 80), (64, 30), (96, 40)])
    owner = RecordingOwner()
    uploaded = handles(images, owner)
    device = torch.device("cuda", 0)
    copies = ImageBatch(images, uploaded).take_uploads(device)
    assert owner.taken == [uploaded] and all(c is u.tensor for c, u in zip(copies, uploaded))
    refused = [
        ImageBatch(images),  # nothing uploaded (a CPU predictor, or batches above 1)
        ImageBatch(images, [uploaded[0], None, uploaded[2]]),  # one image stayed on the host
        ImageBatch(images[:2], uploaded),  # an image dropped after the upload
        ImageBatch([images[0], images[1].copy(), images[2]], uploaded),  # equal bytes, another array
        ImageBatch(images, [uploaded[0], *handles(images[1:2], RecordingOwner()), uploaded[2]]),  # two owners
    ]
    appended = ImageBatch(images, uploaded)
    appended.append(images[0])  # a callback's extra image
    for batch in [*refused, appended]:
        assert batch.take_uploads(device) is None
    assert ImageBatch(images, uploaded).take_uploads(torch.device("cuda", 1)) is None  # another device
    assert owner.taken == [uploaded]


@pytest.fixture(scope="module")
def images_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    write_images(folder)
    return folder


def test_the_loaders_return_image_batches(images_folder):
    """A folder's batches and a list's, with no uploads without a device."""
    folder_batches = [images for _, images, _ in FileLoader(str(images_folder), batch=2, threads=2)]
    assert sum(len(images) for images in folder_batches) == 7  # the broken file is skipped
    paths = [images_folder / name for name in ("a_baseline.jpg", "c_444.jpg", "b_progressive.jpg")]
    list_batches = [images for _, images, _ in PathListLoader(paths, batch=2, threads=2)]
    assert [len(images) for images in list_batches] == [2, 1]
    for images in folder_batches + list_batches:
        assert isinstance(images, ImageBatch) and images.uploads == (None,) * len(images)
