"""A Python list (or tuple) of image paths, decoded as stock decodes it, in parallel and in batches.

Stock Ultralytics hands a list to ``autocast_list``, which opens and EXIF-transposes every image with PIL, one by
one, before the first inference, and then predicts the whole list as one batch (``LoadPilAndNumpy``), whatever
``batch`` says. :class:`PathListLoader` decodes each path with the same two stock functions (``autocast_list`` for
one path, then ``LoadPilAndNumpy._single_check``: PIL, EXIF transpose, RGB -> BGR), on a pool of threads, a
bounded number of batches ahead, and yields batches of ``batch`` images, so that memory stays flat on a list of any
length and inference starts at once.

What stays as stock's: every image's path (``Image.filename``, else ``image{i}.jpg``) and bytes; the log line of
each image (``"{i}: 480x640 ..."``, ``i`` counted over the whole list: the loader's ``info`` carries the prefix that
stock's ``write_results`` adds for its one batch); the error for a path that does not exist or is not an image,
raised before any inference (every path's header is opened first, in parallel, as ``autocast_list`` opens them);
and the letterbox: stock letterboxes its one batch with ``auto`` (minimal padding) only when every image of the
list has one shape, so the loader records ``same_shapes`` for the whole list, and the patched predictor letterboxes
each batch by it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
from PIL import ExifTags, Image
from ultralytics.data.loaders import LoadPilAndNumpy, SourceTypes, autocast_list

from .prefetch import OrderedPrefetch

_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that exif_transpose turns by 90 degrees


def _upright_size(path: str | Path) -> tuple[int, int]:
    """``(width, height)`` of the image after ``ImageOps.exif_transpose``, from its header; raises what
    ``Image.open`` raises for a missing or unidentifiable file (as stock's ``autocast_list`` does)."""
    with Image.open(path) as image:
        width, height = image.size
        if image.getexif().get(ExifTags.Base.Orientation, 1) in _TRANSPOSING_ORIENTATIONS:
            return height, width
        return width, height


def _decode(indexed_path: tuple[int, str | Path], channels: int) -> tuple[str, np.ndarray]:
    """One list entry as stock decodes it: its path as ``LoadPilAndNumpy`` names it, and its BGR (or gray) array."""
    index, path = indexed_path
    image = autocast_list([path])[0]
    return getattr(image, "filename", "") or f"image{index}.jpg", LoadPilAndNumpy._single_check(image, channels)


class PathListLoader(LoadPilAndNumpy):
    """Batches of ``batch`` images from a list of paths, decoded on ``threads`` threads up to ``read_ahead`` batches
    (at least one image per thread) ahead.

    Attributes:
        same_shapes (bool): Whether every image of the list has one (upright) size, as stock's single batch sees it.

    Examples:
        >>> for paths, images, info in PathListLoader(["a.jpg", "b.jpg"], batch=2, threads=2, read_ahead=2):
        ...     pass
    """

    def __init__(self, paths: Sequence[str | Path], batch: int = 1, channels: int = 3, threads: int = 1,
                 read_ahead: int = 2):
        # LoadPilAndNumpy.__init__ is not called: it would hold every decoded image.
        self.sources = list(paths)
        self.bs, self.channels, self.threads, self.read_ahead = batch, channels, threads, read_ahead
        self.mode, self.count = "image", 0
        self.source_type = SourceTypes()  # log lines carry their list index in ``info`` (see the module docstring)
        with ThreadPoolExecutor(max(1, min(threads, len(self.sources)))) as pool:
            sizes = set(pool.map(_upright_size, self.sources))  # raises the first failing path's error, in order
        self.same_shapes = len(sizes) == 1
        self._images: OrderedPrefetch | None = None

    def __len__(self) -> int:
        return len(self.sources)  # as LoadPilAndNumpy: the images, which setup_source compares with 1000

    def __iter__(self) -> PathListLoader:
        self.close()
        self.count = 0
        decode = partial(_decode, channels=self.channels)
        window = max(self.read_ahead * self.bs, self.threads)
        self._images = OrderedPrefetch(decode, enumerate(self.sources), self.threads, window)
        return self

    def __next__(self) -> tuple[list[str], list[np.ndarray], list[str]]:
        start = self.count
        batch = [pair for _, pair in zip(range(self.bs), self._images)] if self._images is not None else []
        if not batch:
            self.close()
            raise StopIteration
        self.count += len(batch)
        paths, images = (list(column) for column in zip(*batch))
        return paths, images, [f"{start + i}: " for i in range(len(batch))]

    def close(self) -> None:
        """Stop the decoder threads (idempotent; the predictor calls it when it stops)."""
        if self._images is not None:
            self._images.close()
            self._images = None

