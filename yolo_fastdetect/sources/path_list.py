"""A Python list (or tuple) of image paths, decoded as stock decodes it, in parallel.

Stock Ultralytics hands a list to ``autocast_list``, which opens and EXIF-transposes every image with PIL, one by
one, before the first inference, and then predicts the whole list as one batch (``LoadPilAndNumpy``), whatever
``batch`` says. :class:`PathListLoader` decodes each path with the same two stock functions (``autocast_list`` for
one path, then ``LoadPilAndNumpy._single_check``: PIL, EXIF transpose, RGB -> BGR), on a pool of threads. The
predictor's loader (:func:`yolo_fastdetect.sources.file_loader`) makes its batch the whole list, as stock's: the
batch's size decides cuDNN's convolution algorithms, whose rounding (TF32 in float32, float16's) reaches the boxes,
so a list predicted in smaller batches would not give stock's detections bit for bit.

A baseline or progressive JPEG in YCbCr or grayscale, without EXIF rotation and ending in its EOI marker, decodes
through OpenCV instead (``cv2.imdecode`` to BGR, about 4x faster than Pillow's route; both run libjpeg-turbo with
its default, exact integer IDCT and fancy upsampling): the bytes are the same, which the tests check on a corpus of
JPEG variants. Anything else (CMYK, EXIF-rotated, PNG and other formats, a truncated file, a 1-channel model) takes
Pillow's route. ``YOLO_FASTDETECT_LIST_OPENCV=0`` sends every file through Pillow.

What stays as stock's: every image's path (``Image.filename``, else ``image{i}.jpg``) and bytes; the log line of
each image (``"{i}: 480x640 ..."``, ``i`` counted over the whole list: the loader's ``info`` carries the prefix that
stock's ``write_results`` adds for its one batch); and the error for a path that does not exist or is not an image,
raised before any inference (every path's header is opened first, in parallel, as ``autocast_list`` opens them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import ExifTags, Image
from ultralytics.data.loaders import LoadPilAndNumpy, SourceTypes, autocast_list

from .batch import ImageBatch
from .jpeg_bytes import ends_in_eoi
from .prefetch import OrderedPrefetch, read_ahead_window
from .upload import Upload, Uploads, loader_uploads


def opencv_decodes(path: str | Path) -> bool:
    """Whether OpenCV decodes ``path`` to the bytes of stock's Pillow route, as its header says: a YCbCr or grayscale
    JPEG that needs no EXIF transpose. Raises what ``Image.open`` raises for a missing or unidentifiable file (as
    stock's ``autocast_list`` does)."""
    with Image.open(path) as image:
        orientation = image.getexif().get(ExifTags.Base.Orientation, 1)
        return image.format == "JPEG" and image.mode in ("RGB", "L") and orientation == 1


def _opencv_jpeg(path: str | Path) -> np.ndarray | None:
    """A JPEG decoded by OpenCV as Pillow + RGB -> BGR would decode it, or None where that is not assured (no EOI)."""
    data = np.fromfile(os.fspath(path), np.uint8)
    if not ends_in_eoi(data):
        return None
    # Pillow found no EXIF rotation; IGNORE_ORIENTATION keeps OpenCV from finding one that Pillow did not parse.
    return cv2.imdecode(data, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)


def _decode(
    entry: tuple[int, str | Path, bool], channels: int, uploads: Uploads | None = None
) -> tuple[str, np.ndarray, Upload | None]:
    """One list entry ``(index, path, opencv_decodes)`` as stock decodes it: its path as ``LoadPilAndNumpy`` names
    it, its BGR (or gray) array, and its upload ahead by ``uploads`` (when given and it applies)."""
    index, path, opencv_decodes = entry
    if opencv_decodes and (image := _opencv_jpeg(path)) is not None:
        name = os.fspath(path)
    else:
        pil_image = autocast_list([path])[0]
        name = getattr(pil_image, "filename", "") or f"image{index}.jpg"
        image = LoadPilAndNumpy._single_check(pil_image, channels)
    return name, image, None if uploads is None else uploads.put(image)


class PathListLoader(LoadPilAndNumpy):
    """Batches of ``batch`` images from a list of paths, decoded on ``threads`` threads up to ``read_ahead`` batches
    (at least one image per thread) ahead.

    Attributes:
        uploads (Uploads | None): The images' copies on ``upload_to``, a CUDA device (:mod:`.upload`), or None.
        lower_priority (bool): Whether the decoder threads run below the caller's priority (:class:`.OrderedPrefetch`;
            for a predictor on a GPU).

    Examples:
        >>> for paths, images, info in PathListLoader(["a.jpg", "b.jpg"], batch=2, threads=2, read_ahead=2):
        ...     pass
    """

    def __init__(self, paths: Sequence[str | Path], batch: int = 1, channels: int = 3, threads: int = 1,
                 read_ahead: int = 2, opencv_jpeg: bool = True, upload_to: torch.device | None = None,
                 lower_priority: bool = False):
        # LoadPilAndNumpy.__init__ is not called: it would hold every decoded image.
        self.sources = list(paths)
        self.bs, self.channels, self.threads, self.read_ahead = batch, channels, threads, read_ahead
        self.lower_priority = lower_priority
        self.mode, self.count = "image", 0
        self.source_type = SourceTypes()  # log lines carry their list index in ``info`` (see the module docstring)
        with ThreadPoolExecutor(max(1, min(threads, len(self.sources)))) as pool:
            decodable = list(pool.map(opencv_decodes, self.sources))  # raises the first failing path's error
        opencv = opencv_jpeg and channels == 3  # a 1-channel model takes Pillow's "L" conversion, not libjpeg's Y
        self._entries = [(i, path, opencv and decodes) for i, (path, decodes) in
                         enumerate(zip(self.sources, decodable))]
        self.uploads = loader_uploads(upload_to, batch, threads, read_ahead)
        self._images: OrderedPrefetch | None = None

    def __len__(self) -> int:
        return len(self.sources)  # as LoadPilAndNumpy: the images, which setup_source compares with 1000

    def __iter__(self) -> PathListLoader:
        self.close()
        self.count = 0
        decode = partial(_decode, channels=self.channels, uploads=self.uploads)
        window = read_ahead_window(self.bs, self.threads, self.read_ahead)
        self._images = OrderedPrefetch(decode, self._entries, self.threads, window, self.lower_priority)
        return self

    def __next__(self) -> tuple[list[str], ImageBatch, list[str]]:
        start = self.count
        batch = [decoded for _, decoded in zip(range(self.bs), self._images)] if self._images is not None else []
        if not batch:
            self.close()
            raise StopIteration
        self.count += len(batch)
        paths, images, uploads = (list(column) for column in zip(*batch))
        info = [f"{start + i}: " for i in range(len(batch))]
        return paths, ImageBatch(images, uploads), info

    def close(self) -> None:
        """Stop the decoder threads (idempotent; the predictor calls it when it stops)."""
        if self._images is not None:
            self._images.close()
            self._images = None
        if self.uploads is not None:
            self.uploads.clear()

